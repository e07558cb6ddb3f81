"""Danube's gRPC doors: its client API and its admin API, served by calls of ours (README.md)."""
