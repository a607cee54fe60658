"""Demo reference models with real, trained denoising dynamics (for measuring cache quality).

* ``pixels``  exact linear map between RGB pixels and 16-channel latents (no VAE)
* ``data``    procedural class-conditional images and videos (seeded)
* ``models``  a small Flux (image) and Wan 2.1 T2V (video) built with ComfyUI's own classes,
              ``load_model(kind)``, ``conditioning(kind, class_index, batch)``, ``empty_latent``
* ``train``   the CPU training run that produced ``weights/`` (``./dev train image|video``)
* ``preview`` KSampler samples per class as a PNG grid (``./dev preview image|video``)
* ``probe``   a feature-based class probe that scores whether samples look like their class

The pack's demo nodes (nodes/demo_nodes.py) import ``data``, ``models`` and ``pixels``; training,
preview and probe are only imported by their commands and the tests.
"""
