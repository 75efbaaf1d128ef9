"""Builds localchat's optional CPU kernels (csrc/) beside the metadata in pyproject.toml.

The extension is `optional`: without a C compiler `pip install .` still succeeds and the torch backend
runs its pure-torch path (it logs that the kernels are missing). The library has a plain C ABI loaded
through ctypes, so it does not depend on the installed torch version; it is built against CPython's
limited API (one build serves every Python 3.10+).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class KernelBuild(build_ext):
    """Per-compiler flags: OpenMP where the compiler has it (Apple clang does not: one thread there)."""

    def build_extensions(self) -> None:
        msvc = self.compiler.compiler_type == "msvc"
        for ext in self.extensions:
            if msvc:
                ext.extra_compile_args = ["/O2", "/openmp"]
            elif sys.platform == "darwin":
                ext.extra_compile_args = ["-O3"]
            else:
                ext.extra_compile_args = ["-O3", "-fopenmp"]
                ext.extra_link_args = ["-fopenmp"]
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "localchat._lckernels",
            sources=["csrc/lc_kernels.c"],
            depends=[
                "csrc/lc_kernels.h",
                "csrc/lc_impl.h",
                "csrc/lc_decode.h",
                "csrc/lc_attention.h",
                "csrc/lc_fused.h",
                "csrc/lc_x16_avx512.h",
                "csrc/lc_x16_avx2.h",
                "csrc/lc_x16_layout.h",
                "csrc/lc_step.h",
                "csrc/lc_x16_neon.h",
                "csrc/lc_iquants.h",
                "csrc/lc_iq_gemm.h",
                "csrc/lc_iq_grids.h",
                "csrc/lc_mxfp4.h",
                "csrc/lc_lowbit.h",
                "csrc/lc_lowbit_rows.h",
                "csrc/lc_lowbit_x16.h",
                "csrc/lc_deltanet.h",
                "csrc/lc_argmax.h",
            ],
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            py_limited_api=True,
            optional=True,
        )
    ],
    cmdclass={"build_ext": KernelBuild},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},  # one wheel per platform for every CPython 3.10+
)
