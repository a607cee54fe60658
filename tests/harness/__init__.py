"""Test harness: the real ComfyUI host, in-process and over HTTP, with this pack loaded.

Nothing here replaces a ComfyUI module. ``host.boot()`` imports the real ComfyUI tree named by
``COMFYUI_DIR`` (``./dev test`` sets it), loads this pack through ComfyUI's own custom-node
loader, and ``server.ComfyServer`` runs the real ``main.py``.
"""
