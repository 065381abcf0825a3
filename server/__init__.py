"""The tuning service: a REST API (FastAPI + uvicorn) over the store's job queue,
and the worker loop that runs the jobs on GPUs.

``main.py`` assembles the app; ``api/routes/`` holds one router per resource;
``deps.py`` the shared dependencies (the store, authentication); ``schemas.py``
the request and response models; ``config.py`` the settings; ``worker.py`` the
worker loop (``stages.py`` what it measures with, ``recorder.py`` its recorder);
``state.py`` what the routes share in one process (the store, caches, token
checks); ``process.py`` runs ``ws-tune serve`` and ``ws-tune worker``. All SQL
lives in ``ws_tuner/store/`` (``queue.py``, ``registry.py``). The server never imports
kernel sources: uploaded code runs only in worker processes.
"""
