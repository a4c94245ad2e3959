"""The transform step on Spark: ``session`` starts or finds the Spark session, ``merge_job`` runs one batch
(parse in executors, group by partition, reconcile, write Delta). ``spark_jobs/merge_batch.py`` is its
``spark-submit`` entry point.
"""
