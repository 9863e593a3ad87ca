"""Order rules built around the memory caps: list schedules, V-Half/V-Min, PipeOffload."""
