"""Running hybridtrace on Apache Spark (``--engine spark``, docs/spark.md).

``session.py`` opens the SparkSession (a master, a Spark Connect remote, ``spark.*``
settings); ``ingest.py`` is the driver's side of an ingest fanned out to executors, and
``tasks.py`` what an executor runs: the same format parsers on the objects handed to it,
returning each object's tables as Arrow IPC bytes. PySpark is imported only here, and
only when the spark engine is chosen.
"""
