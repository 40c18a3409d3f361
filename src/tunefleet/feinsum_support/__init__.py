"""Interoperation with feinsum (batched einsums, their transform spaces and timing archives).

Everything in this package except :mod:`~tunefleet.feinsum_support.canonical` and
:mod:`~tunefleet.feinsum_support.runtime` works without feinsum, loopy or OpenCL, on any
Python tunefleet supports:

``einsum_spec``   a batched einsum as plain data: parsing the command-line forms, validation,
                  and the exact strings feinsum's archive stores
``static_space``  reads the ``transform_param`` decorators of a transform-space module with
                  :mod:`ast` and turns them into a :class:`~tunefleet.space.Space`
``spaces``        where transform-space modules live (``feinsum:NAME.py`` or a path)
``archive``       feinsum's SQLite archive layout (``FEINSUM_TIMING_FACTS``): reading,
                  writing, and mapping rows to and from our measurements
``canonical``     feinsum's canonical form of an einsum and the archive strings feinsum renders
                  for it (needs feinsum; shared by ``archive`` and ``runtime``)
``problem``       the ``feinsum`` problem the registry names: its space, arguments and cache
                  keys (it lives here, beside what it uses, so ``tunefleet.problems`` never
                  imports this package and this package may import ``tunefleet.problems``)
``runtime``       the worker side: builds the einsum and applies the transform with feinsum
                  itself (imported only inside functions, with a clear error when missing)
"""

#: The message every missing-feinsum error carries.
INSTALL_HINT = "install tunefleet[feinsum] on Python >= 3.12 (feinsum needs it)"
