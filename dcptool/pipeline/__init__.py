"""Spark jobs: backup, restore, merge and export, and the PySpark data source for archives."""
