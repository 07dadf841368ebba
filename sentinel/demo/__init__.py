"""`sentinel demo`: the whole story on the embedded default (`demo.py`), and the training job it runs (`job.py`)."""
