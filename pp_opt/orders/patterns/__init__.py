"""Fixed order patterns: the classic schedules and PyTorch's, whatever the costs."""
