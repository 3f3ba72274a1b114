"""The dcptool command line."""
