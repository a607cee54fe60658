"""The dev harness: the real ComfyUI host, in-process and over HTTP, with this pack loaded.

One importable package for the tests, the demo, the benchmark, training and the fuzzer: ``./dev``
puts ``tests/`` on ``PYTHONPATH`` for every command (``./dev py`` runs the host's Python with it),
and pytest's ``pythonpath`` does the same for the tests. Nothing here replaces a ComfyUI module.

* ``host``      ``boot()`` imports the real ComfyUI tree named by ``COMFYUI_DIR`` (``./dev`` sets
                it), loads this pack through ComfyUI's own custom-node loader; ``comfyui_version()``
* ``server``    ``ComfyServer`` runs the real ``main.py`` on a free port
* ``sampling``  KSampler runs of the tiny models, the pack's nodes applied as ComfyUI applies them
* ``fuzz``      randomized run sequences and the memory soak (``./dev fuzz``)
* ``comfy_test_nodes``  test-only ComfyUI nodes and the tiny models (never shipped)
* ``tiny_template``, ``demo_reference``  authoring tools: a new tiny model's template, the demo
                models' fixed-seed reference
"""
