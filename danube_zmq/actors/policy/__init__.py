"""Policies: the pure rule of what is in force, and the child that keeps and tells them."""
