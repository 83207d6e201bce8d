"""The Streamlit dashboard: a read-only view of the alert store (``dashboard/app.py``)."""
