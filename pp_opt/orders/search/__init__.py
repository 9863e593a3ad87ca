"""What searching generators share (quick timing, local search, budgets) and the warm
starts of a solve."""
