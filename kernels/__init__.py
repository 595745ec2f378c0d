from kernels.attention import attention  # noqa: F401
