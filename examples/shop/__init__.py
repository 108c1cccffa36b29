"""The shop: the demo pipeline of weir (orders, a customers table, page views; joins, windows, alerts).

records.py makes the synthetic records (pure Python), generator.py serves them as a Spark streaming data
source, pipeline.py declares the pipeline, demo.py runs it with a live table (`make demo`).
"""
