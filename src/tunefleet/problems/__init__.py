"""Problems: what is tuned. ``base`` defines the contract, ``registry`` finds problems by name,
file path or ``module:attr``; one module per built-in problem.

Problem modules never import loopy or pyopencl at module level: the coordinator imports them
to read spaces and argument rules on machines without OpenCL.
"""
