"""The real model configs hybridtrace ships (config.json files of Hugging Face models), read by catalog.py."""
