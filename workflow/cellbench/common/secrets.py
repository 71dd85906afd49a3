"""The secret variables the pipeline passes through to its jobs by name and never writes out.

Lives at the bottom so the config check, the job command lines and the containers share one list.
"""

SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")
