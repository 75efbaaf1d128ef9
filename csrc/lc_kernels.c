/* localchat's CPU kernels: matmul straight from GGUF quantized blocks with 8-bit activations and
integer dot products, runtime-dispatched on the CPU's features.

A plain C ABI (raw pointers and sizes, no torch or numpy types) loaded through ctypes, so one build
serves every torch version; the Python module init below only exists because setuptools builds
extension modules (and Windows wants the export). Functions return 0 on success, -1 on a bad argument. */

#ifndef LC_NO_PYTHON /* -DLC_NO_PYTHON: a plain shared library (cross builds and C test harnesses) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define LC_X86 1
#include <immintrin.h>
#endif

/* aarch64: gcc compiles the NEON kernels for the dot product and picks them at run time; clang's arm_neon.h
   only declares the dot product where the whole build targets it (the default on Apple silicon). */
#if defined(__aarch64__) && ((defined(__GNUC__) && !defined(__clang__)) || defined(__ARM_FEATURE_DOTPROD))
#define LC_ARM 1
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif

#ifdef _MSC_VER
#define LC_THREAD __declspec(thread)
#else
#define LC_THREAD _Thread_local
#endif

#include "lc_kernels.h" /* every export's declaration, the type and ISA ids */

/* bytes per block and 32-value sub-blocks per block of a type */
static inline int64_t lc_block_bytes(int type) {
    switch (type) {
    case LC_Q4_0: return 18;
    case LC_Q4_1: return 20;
    case LC_Q5_0: return 22;
    case LC_Q5_1: return 24;
    case LC_Q8_0: return 34;
    case LC_Q2_K: return 84;
    case LC_Q3_K: return 110;
    case LC_Q4_K: return 144;
    case LC_Q5_K: return 176;
    case LC_IQ2_XXS: return 66;
    case LC_IQ2_XS: return 74;
    case LC_IQ3_XXS: return 98;
    case LC_IQ1_S: return 50;
    case LC_IQ4_NL: return 18;
    case LC_IQ3_S: return 110;
    case LC_IQ2_S: return 82;
    case LC_IQ4_XS: return 136;
    case LC_IQ1_M: return 56;
    case LC_TQ1_0: return 54;
    case LC_TQ2_0: return 66;
    case LC_MXFP4: return 17;
    case LC_NVFP4: return 36;
    case LC_Q1_0: case LC_Q2_0: return 18;
    default: return 210;
    }
}
/* K-quants, i-quants but IQ4_NL, TQ types: 256 values; NVFP4 and Q2_0 64, Q1_0 128 */
static inline int64_t lc_block_subs(int type) {
    if (type == LC_NVFP4 || type == LC_Q2_0) return 2;
    if (type == LC_Q1_0) return 4;
    return type >= LC_Q2_K && type != LC_IQ4_NL && type != LC_MXFP4 ? 8 : 1;
}
/* Types whose scale changes every 16 values (the GEMMs convert their integer sums to float that often). */
static inline int lc_scales_per16(int type) { return type == LC_Q2_K || type == LC_Q3_K || type == LC_Q6_K; }

static inline uint16_t lc_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline float lc_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        float v = ldexpf((float)man, -24); /* zero or subnormal */
        return sign ? -v : v;
    }
    bits = exp == 31 ? (sign | 0x7F800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float lc_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* e^x to about 2 float32 ulp in plain arithmetic the compiler vectorizes (libm's expf is one scalar
   call per value): e^x = 2^k * e^r with k = round(x / ln 2), r = x - k ln 2 (ln 2 split in two so r is
   exact), e^r by the classic minimax polynomial of degree 7 on |r| <= ln 2 / 2. x below -87.3 gives
   about 1e-38 (not 0) and x above 88.7 about 3e38 (not inf): callers only feed it scores minus their max
   (<= 0) and SiLU's -x, where those ends do not change a float32 result that matters. */
static inline float lc_exp(float x) {
    x = x < -87.3f ? -87.3f : x > 88.7f ? 88.7f : x;
    float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest without rint() */
    float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* float -> bfloat16 bits, rounded to nearest even (inf and NaN keep their pattern). */
static inline uint16_t lc_to_bf16(float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if ((bits & 0x7F800000u) != 0x7F800000u) bits += 0x7FFFu + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* out[i] = v as float32, or as bfloat16 rounded to nearest even. */
static inline void lc_store(void *out, int out_bf16, int64_t i, float v) {
    if (out_bf16) ((uint16_t *)out)[i] = lc_to_bf16(v);
    else ((float *)out)[i] = v;
}

/* The one way a scratch buffer grows: *buf afterwards holds at least `need` bytes (old contents dropped),
   or is NULL with size 0 when memory ran out, and the caller returns LC_ENOMEM without writing anything.
   Every per-thread buffer uses it: grown on demand and kept, as the thread pool is long-lived. */
static void *lc_grow(void **buf, size_t *size, size_t need) {
    if (need > *size) {
        free(*buf);
        *buf = malloc(need);
        *size = *buf ? need : 0;
    }
    return *buf;
}

/* A per-thread scratch buffer: the pointer and its size. */
#define LC_SCRATCH(name)                                                                                         \
    static LC_THREAD void *name;                                                                                 \
    static LC_THREAD size_t name##_size

/* Per-thread decode buffers of the GGUF-layout reference (each OpenMP thread its own). */
LC_SCRATCH(lc_buf);

/* Codes, lane scales and offsets for `weights` decoded weights in the calling thread's buffer; LC_ENOMEM
   (and nothing pointed to) when it cannot grow. */
static int lc_scratch(int64_t weights, uint8_t **c, float **ls, float **mc) {
    size_t need = (size_t)weights + (size_t)weights + (size_t)weights / 4 + 256; /* codes, k/4 + k/16 floats */
    uint8_t *buf = (uint8_t *)lc_grow(&lc_buf, &lc_buf_size, need);
    if (!buf) return LC_ENOMEM;
    *c = buf;
    *ls = (float *)(buf + ((weights + 63) & ~(int64_t)63));
    *mc = *ls + weights / 4;
    return LC_OK;
}

/* Floats per activation row in xs: an offset sum per 16 values, then (as int32) minus each 4-value
   lane's sum of codes. */
#define LC_XS(k) ((k) / 16 + (k) / 4)

#include "lc_mxfp4.h"
#include "lc_lowbit.h"
#include "lc_argmax.h"

#define LC_FN(name) name##_portable
#define LC_ISA LC_ISA_PORTABLE
#include "lc_impl.h"
#include "lc_iquants.h"
#include "lc_attention.h"
#include "lc_fused.h"
#include "lc_deltanet.h"
#undef LC_FN
#undef LC_ISA

#include "lc_x16_layout.h"

#define LC_FN(name) name##_portable
#define LC_ISA LC_ISA_PORTABLE
#include "lc_iq_gemm.h"
#undef LC_FN
#undef LC_ISA

#ifdef LC_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define LC_FN(name) name##_avx2
#define LC_ISA LC_ISA_AVX2
#include "lc_impl.h"
#include "lc_iquants.h"
#include "lc_x16_avx2.h"
#include "lc_iq_gemm.h"
#include "lc_attention.h"
#include "lc_fused.h"
#include "lc_deltanet.h"
#undef LC_FN
#undef LC_ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define LC_FN(name) name##_avx512vnni
#define LC_ISA LC_ISA_AVX512VNNI
#include "lc_impl.h"
#include "lc_iquants.h"
#include "lc_x16_avx512.h"
#include "lc_iq_gemm.h"
#include "lc_attention.h"
#include "lc_fused.h"
#include "lc_deltanet.h"
#undef LC_FN
#undef LC_ISA
#pragma GCC pop_options
#endif

#ifdef LC_ARM
#ifndef __clang__
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif
#define LC_FN(name) name##_neon
#define LC_ISA LC_ISA_NEON
#include "lc_x16_neon.h"
#include "lc_iquants.h" /* the i-quants through lc_iq_neon.h, here with sdot */
#include "lc_iq_gemm.h"
#undef LC_FN
#undef LC_ISA
#ifndef __clang__
#pragma GCC pop_options
#endif

/* Whether this aarch64 CPU has the dot product instructions (every Apple M chip; Cortex-A55/A76 on). */
static int lc_arm_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & (1UL << 20)) != 0; /* HWCAP_ASIMDDP */
#elif defined(__APPLE__)
    int on = 0;
    size_t size = sizeof(on);
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &on, &size, NULL, 0) == 0 && on;
#else
    return 0;
#endif
}
#endif

static int lc_type_ok(int type, int64_t k) {
    switch (type) {
    case LC_Q4_0: case LC_Q4_1: case LC_Q5_0: case LC_Q5_1: case LC_Q8_0: return k > 0 && k % 32 == 0;
    case LC_Q2_K: case LC_Q3_K: case LC_Q4_K: case LC_Q5_K: case LC_Q6_K: return k > 0 && k % 256 == 0;
    case LC_IQ4_NL: case LC_MXFP4: return k > 0 && k % 32 == 0;
    case LC_NVFP4: case LC_Q2_0: return k > 0 && k % 64 == 0;
    case LC_Q1_0: return k > 0 && k % 128 == 0;
    case LC_IQ2_XXS: case LC_IQ2_XS: case LC_IQ3_XXS: case LC_IQ1_S: case LC_IQ3_S: case LC_IQ2_S: case LC_IQ4_XS:
    case LC_IQ1_M: case LC_TQ1_0: case LC_TQ2_0: return k > 0 && k % 256 == 0;
    default: return 0;
    }
}

LC_EXPORT int lc_isa_supported(int isa) {
    if (isa == LC_ISA_PORTABLE) return 1;
#ifdef LC_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == LC_ISA_AVX2) return avx2;
    if (isa == LC_ISA_AVX512VNNI)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#ifdef LC_ARM
    if (isa == LC_ISA_NEON) return lc_arm_dotprod();
#endif
    return 0;
}

LC_EXPORT int lc_isa_best(void) {
    for (int isa = LC_ISA_NEON; isa > LC_ISA_PORTABLE; isa--)
        if (lc_isa_supported(isa)) return isa;
    return LC_ISA_PORTABLE;
}

LC_EXPORT int lc_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* x [t, k] (row stride ldx elements; float32, or bfloat16 if x_bf16) -> xq int8 [t, k], xd float
   [t, k / 4] (the scale of each 32, repeated per 4-value lane), xs float [t, LC_XS(k)] (scale * sum of codes per 16, then int32 minus each 4-value lane's sum). */
LC_EXPORT int lc_quantize(int isa, const void *x, int x_bf16, int64_t t, int64_t k, int64_t ldx, int8_t *xq,
                          float *xd, float *xs, int nth) {
    if (k % 32 || t < 0 || !lc_isa_supported(isa)) return -1;
#ifdef LC_X86
    if (isa == LC_ISA_AVX512VNNI) { quantize_avx512vnni(x, x_bf16, t, k, ldx, xq, xd, xs, nth); return 0; }
    if (isa == LC_ISA_AVX2) { quantize_avx2(x, x_bf16, t, k, ldx, xq, xd, xs, nth); return 0; }
#endif
    quantize_portable(x, x_bf16, t, k, ldx, xq, xd, xs, nth);
    return 0;
}

/* Whether matrices of `type` and k columns can be repacked into the x16 layout for `isa` (its kernels:
   AVX-512 VNNI, lc_x16_avx512.h; AVX2, lc_x16_avx2.h; NEON, lc_x16_neon.h). */
LC_EXPORT int lc_x16_supported(int isa, int type, int64_t k) {
    return isa != LC_ISA_PORTABLE && lc_isa_supported(isa) && lc_x16_type_ok(type) &&
           lc_type_ok(type, k) && ((type != LC_Q1_0 && type != LC_Q2_0) || isa == LC_ISA_AVX512VNNI); /* lc_lowbit_x16.h */
}

/* Bytes of the x16 form of n rows of `type` with k columns (whole panels of 16 rows). */
LC_EXPORT int64_t lc_x16_bytes(int type, int64_t n, int64_t k) {
    if (!lc_x16_type_ok(type) || !lc_type_ok(type, k) || n < 0) return -1;
    return (n + 15) / 16 * lc_x16_panel_bytes(type, k);
}

/* out (lc_x16_bytes) = the n GGUF rows of w (row_bytes apart) in the x16 layout (lc_x16_layout.h), on
   nth threads. */
LC_EXPORT int lc_x16_repack(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out,
                            int nth) {
    if (!lc_x16_type_ok(type) || !lc_type_ok(type, k) || n < 0 ||
        row_bytes < k / 32 * lc_block_bytes(type) / lc_block_subs(type))
        return -1;
    lc_x16_pack(type, w, n, k, row_bytes, out, nth < 1 ? 1 : nth);
    return 0;
}

/* Per-thread activation summaries of the x16 kernels (the caller's thread), grown by lc_grow. */
LC_SCRATCH(lc_xsums);

/* The x16 kernels' per-16 and per-32 activation sums and scales, from lc_quantize's outputs. */
static int lc_x16_summaries(int64_t t, int64_t k, const int8_t *xq, const float *xd, const float *xs,
                            lc_x16_sums *x) {
    size_t need = (size_t)t * (size_t)(k / 16 + 3 * (k / 32)) * 4 + 64;
    if (!lc_grow(&lc_xsums, &lc_xsums_size, need)) return LC_ENOMEM;
    int32_t *ns16 = (int32_t *)lc_xsums, *ns32 = ns16 + t * (k / 16);
    float *dx32 = (float *)(ns32 + t * (k / 32)), *fs32 = dx32 + t * (k / 32);
    for (int64_t i = 0; i < t; i++) {
        const float *sums = xs + i * LC_XS(k);
        const int32_t *lanes = (const int32_t *)(sums + k / 16); /* minus each 4 values' sum */
        for (int64_t h = 0; h < k / 16; h++)
            ns16[i * (k / 16) + h] = lanes[4 * h] + lanes[4 * h + 1] + lanes[4 * h + 2] + lanes[4 * h + 3];
        for (int64_t s = 0; s < k / 32; s++) {
            ns32[i * (k / 32) + s] = ns16[i * (k / 16) + 2 * s] + ns16[i * (k / 16) + 2 * s + 1];
            dx32[i * (k / 32) + s] = xd[i * (k / 4) + 8 * s];
            fs32[i * (k / 32) + s] = sums[2 * s] + sums[2 * s + 1];
        }
    }
    x->xq = xq;
    x->ns16 = ns16;
    x->ns32 = ns32;
    x->dx32 = dx32;
    x->fs32 = fs32;
    return 0;
}

/* out[i, j] (row stride ldo; float32 or bfloat16) = sum_k x[i, k] * w[j, k] for the quantized
   activations of lc_quantize and w: n rows of GGUF blocks of `type`, row_bytes apart, or with
   type | LC_X16 the x16 form of lc_x16_repack (row_bytes unused). */
LC_EXPORT int lc_matmul(int isa, int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes,
                        const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                        int out_bf16, int64_t ldo, int nth) {
    if (type & LC_X16) {
        if (!lc_x16_supported(isa, type & ~LC_X16, k) || nth < 1 || t < 0) return -1;
        lc_x16_sums x;
        if (lc_x16_summaries(t, k, xq, xd, xs, &x)) return LC_ENOMEM;
#ifdef LC_X86
        if (isa == LC_ISA_AVX512VNNI) x16_matmul_avx512vnni(type & ~LC_X16, w, n, k, x, t, out, out_bf16, ldo, nth);
        else x16_matmul_avx2(type & ~LC_X16, w, n, k, x, t, out, out_bf16, ldo, nth);
#endif
#ifdef LC_ARM
        x16_matmul_neon(type & ~LC_X16, w, n, k, x, t, out, out_bf16, ldo, nth);
#endif
        return 0;
    }
    if (!lc_type_ok(type, k) || !lc_isa_supported(isa) || nth < 1) return -1;
    if (lc_is_iq(type) && t >= LC_IQG_MIN_ROWS) { /* many rows: lc_iq_gemm.h's panels */
#ifdef LC_X86
        if (isa == LC_ISA_AVX512VNNI) {
            lc_x16_sums x;
            if (lc_x16_summaries(t, k, xq, xd, xs, &x)) return LC_ENOMEM;
            return iq_gemm_avx512vnni(type, w, n, k, row_bytes, xq, xd, &x, t, out, out_bf16, ldo, nth);
        }
        if (isa == LC_ISA_AVX2) {
            lc_x16_sums x;
            if (lc_x16_summaries(t, k, xq, xd, xs, &x)) return LC_ENOMEM;
            return iq_gemm_avx2(type, w, n, k, row_bytes, xq, xd, &x, t, out, out_bf16, ldo, nth);
        }
#endif
#ifdef LC_ARM
        if (isa == LC_ISA_NEON) return iq_gemm_neon(type, w, n, k, row_bytes, xq, xd, NULL, t, out, out_bf16, ldo, nth);
#endif
        return iq_gemm_portable(type, w, n, k, row_bytes, xq, xd, NULL, t, out, out_bf16, ldo, nth);
    }
    if (lc_is_iq(type)) { /* lc_iquants.h (NEON: lc_iq_neon.h) */
#ifdef LC_X86
        lc_x16_sums x = {0};
        /* x86 IQ4_XS reads the activations' per-32 scales compactly (iq4xs_rows) */
        if (type == LC_IQ4_XS && (isa == LC_ISA_AVX512VNNI || isa == LC_ISA_AVX2) && lc_x16_summaries(t, k, xq, xd, xs, &x))
            return LC_ENOMEM;
        if (isa == LC_ISA_AVX512VNNI) iq_matmul_avx512vnni(type, w, n, k, row_bytes, xq, xd, x.dx32, t, out, out_bf16, ldo, nth);
        else if (isa == LC_ISA_AVX2) iq_matmul_avx2(type, w, n, k, row_bytes, xq, xd, x.dx32, t, out, out_bf16, ldo, nth);
        else
#endif
#ifdef LC_ARM
        if (isa == LC_ISA_NEON) iq_matmul_neon(type, w, n, k, row_bytes, xq, xd, NULL, t, out, out_bf16, ldo, nth);
        else
#endif
            iq_matmul_portable(type, w, n, k, row_bytes, xq, xd, NULL, t, out, out_bf16, ldo, nth);
        return 0;
    }
    /* Legacy and K-quant blocks as stored: the portable reference on every ISA (the SIMD ISAs read these
       types in the x16 layout; LOCALCHAT_KERNEL_LAYOUT=gguf keeps them here). */
    return matmul_portable(type, w, n, k, row_bytes, xq, xd, xs, t, out, out_bf16, ldo, nth);
}

/* Per-thread activation buffers of lc_linear (the caller's thread), grown by lc_grow. */
LC_SCRATCH(lc_act);

/* Grows lc_act to hold `rows` quantized activation rows of k (xd, xs, then xq: lc_quantize's outputs)
   plus `extra` bytes after them, and points xd/xs/xq into it. */
static int lc_act_rows(int64_t rows, int64_t k, size_t extra, float **xd, float **xs, int8_t **xq) {
    size_t need = (size_t)rows * (size_t)(k + (k / 4 + LC_XS(k)) * 4) + extra + 128;
    if (!lc_grow(&lc_act, &lc_act_size, need)) return LC_ENOMEM;
    *xd = (float *)lc_act;
    *xs = *xd + rows * (k / 4);
    *xq = (int8_t *)(*xs + rows * LC_XS(k));
    return 0;
}

/* Every segment of a linear on quantized activations xq/xd/xs of t rows. */
static int lc_segments(int isa, int64_t t, int64_t k, int nseg, const int *types, const uint64_t *ptrs,
                       const int64_t *rows, const int64_t *row_bytes, const int8_t *xq, const float *xd,
                       const float *xs, void *out, int out_bf16, int64_t ldo, int nth) {
    int64_t first = 0;
    size_t item = out_bf16 ? 2 : 4;
    for (int i = 0; i < nseg; i++) {
        char *dst = (char *)out + first * item;
        int rc = lc_matmul(isa, types[i], (const uint8_t *)(uintptr_t)ptrs[i], rows[i], k, row_bytes[i], xq, xd, xs,
                           t, dst, out_bf16, ldo, nth);
        if (rc) return rc;
        first += rows[i];
    }
    return 0;
}

/* Rows of x taken per round in precise mode: its fp32 scratch is 2 * LC_PRECISE_ROWS output rows. */
#define LC_PRECISE_ROWS 64

/* lc_quantize, then lc_matmul for each of `nseg` row segments (types[i], weights ptrs[i] of rows[i]
   rows, row_bytes[i] apart) writing consecutive output columns: one call per linear layer.
   precise: each activation row also contributes its rounding residual (x - its 8-bit form, quantized
   to 8 bits again) as a second row whose output is added: about 15 bits per activation (the error of
   the 8-bit form divided by ~250) for twice the integer dot products, the weights still decoded once.
   Near-tied tokens of small 4-bit models flip on the plain 8-bit form. */
LC_EXPORT int lc_linear(int isa, const void *x, int x_bf16, int64_t t, int64_t k, int nseg, const int *types,
                        const uint64_t *ptrs, const int64_t *rows, const int64_t *row_bytes, int precise,
                        void *out, int out_bf16, int64_t ldo, int nth) {
    if (k % 32 || t < 0 || nth < 1 || !lc_isa_supported(isa)) return -1;
    float *xd, *xs;
    int8_t *xq;
    if (!precise) {
        int rc = lc_act_rows(t, k, 0, &xd, &xs, &xq);
        if (rc || (rc = lc_quantize(isa, x, x_bf16, t, k, k, xq, xd, xs, nth))) return rc;
        return lc_segments(isa, t, k, nseg, types, ptrs, rows, row_bytes, xq, xd, xs, out, out_bf16, ldo, nth);
    }
    int64_t n = 0;
    for (int i = 0; i < nseg; i++) n += rows[i];
    int64_t cap = t < LC_PRECISE_ROWS ? t : LC_PRECISE_ROWS, a = 2 * cap; /* activation rows per round */
    /* after the activation rows: the residuals [cap, k] and both rows' outputs [a, n], float32 */
    if (lc_act_rows(a, k, (size_t)(cap * k + a * n) * 4, &xd, &xs, &xq)) return LC_ENOMEM;
    float *res = (float *)(xq + a * k), *y = res + cap * k;
    for (int64_t r0 = 0; r0 < t; r0 += cap) {
        int64_t m = t - r0 < cap ? t - r0 : cap;
        const char *xr = (const char *)x + (size_t)(r0 * k) * (x_bf16 ? 2 : 4);
        if (lc_quantize(isa, xr, x_bf16, m, k, k, xq, xd, xs, nth)) return -1;
        for (int64_t i = 0; i < m * k; i++) res[i] = lc_load(xr, x_bf16, i) - (float)xq[i] * xd[i / 4];
        /* the residual rows right after the rows: one call serves both (one-row steps stay on the
           few-row path, which decodes each weight block once for every row) */
        if (lc_quantize(isa, res, 0, m, k, k, xq + m * k, xd + m * (k / 4), xs + m * LC_XS(k), nth)) return -1;
        int rc = lc_segments(isa, 2 * m, k, nseg, types, ptrs, rows, row_bytes, xq, xd, xs, y, 0, n, nth);
        if (rc) return rc;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                lc_store(out, out_bf16, (r0 + i) * ldo + j, y[i * n + j] + y[(m + i) * n + j]);
    }
    return 0;
}

/* out [r, k] = the weight rows ids[0..r) dequantized (embedding lookups from the quantized table). */
LC_EXPORT int lc_dequant_rows(int type, const uint8_t *w, int64_t k, int64_t row_bytes, const int64_t *ids,
                              int64_t r, void *out, int out_bf16) {
    if (type & LC_X16) { /* x16 form: row_bytes unused */
        type &= ~LC_X16;
        if (!lc_x16_type_ok(type) || !lc_type_ok(type, k)) return -1;
        float *row = (float *)malloc((size_t)k * sizeof(float));
        if (!row) return LC_ENOMEM;
        for (int64_t i = 0; i < r; i++) {
            lc_x16_row(type, w, k, ids[i], row);
            for (int64_t j = 0; j < k; j++) lc_store(out, out_bf16, i * k + j, row[j]);
        }
        free(row);
        return 0;
    }
    if (!lc_type_ok(type, k)) return -1;
    if (lc_is_iq(type)) {
        lc_iq_dequant(type, w, k, row_bytes, ids, r, out, out_bf16);
        return 0;
    }
    dequant_portable(type, w, k, row_bytes, ids, r, out, out_bf16);
    return 0;
}

/* Per-thread partial softmax results of lc_decode_attention (the caller's thread), grown by lc_grow. */
LC_SCRATCH(lc_att);

/* Decode attention over the paged KV cache (csrc/lc_attention.h), one query token per row:
   q [rows, heads, d] -> out [rows, heads, d] (each float32, or bfloat16 if *_bf16); cache
   [2, kv_heads, num_slots, d] (K then V) of cache_type 0 float32, 1 bfloat16 or 2 int8, the int8 form
   with scales float32 [2, kv_heads, num_slots] (value = code * scale; NULL for the other types);
   tables int64 [rows, max_blocks] of block ids; seq_lens int64
   [rows]. window > 0: attend only to the last `window` positions; softcap > 0: scores become
   softcap * tanh(score / softcap). Returns -1 on bad shapes or a block id outside the cache. */
LC_EXPORT int lc_decode_attention(int isa, const void *q, int q_bf16, int64_t rows, int64_t heads,
                                  int64_t kv_heads, int64_t d, const void *cache, int cache_type,
                                  const float *scales, int64_t num_slots, const int64_t *tables,
                                  int64_t max_blocks,
                                  const int64_t *seq_lens, int64_t block_size, float scale, int64_t window,
                                  float softcap, void *out, int out_bf16, int nth) {
    if (!lc_isa_supported(isa) || rows < 0 || kv_heads < 1 || heads % kv_heads || d < 1 || d > LC_ATT_MAX_D ||
        heads / kv_heads > LC_ATT_MAX_GROUP || block_size < 1 || num_slots % block_size || nth < 1 ||
        cache_type < LC_KV_F32 || cache_type > LC_KV_INT8 || (cache_type == LC_KV_INT8) != (scales != NULL))
        return -1;
    for (int64_t r = 0; r < rows; r++) { /* checked here so that no thread reads outside the cache */
        if (seq_lens[r] < 0 || seq_lens[r] > max_blocks * block_size) return -1;
        for (int64_t b = 0; b * block_size < seq_lens[r]; b++) {
            int64_t id = tables[r * max_blocks + b];
            if (id < 0 || (id + 1) * block_size > num_slots) return -1;
        }
    }
    /* Split each pair's positions when pairs alone leave threads idle (2 items per thread balance the
       dynamic schedule), but never into parts shorter than LC_ATT_MIN_PART positions. */
    int64_t pairs = rows * kv_heads, longest = 0, parts = 1, total = 0;
    for (int64_t r = 0; r < rows; r++) {
        longest = seq_lens[r] > longest ? seq_lens[r] : longest;
        total += seq_lens[r];
    }
    if (total * heads * d < 65536) nth = 1; /* a few microseconds of work: waking threads costs more */
    if (window > 0 && longest > window) longest = window;
    if (pairs > 0 && pairs < 2 * (int64_t)nth) parts = (2 * (int64_t)nth + pairs - 1) / pairs;
    if (parts > longest / LC_ATT_MIN_PART) parts = longest / LC_ATT_MIN_PART > 1 ? longest / LC_ATT_MIN_PART : 1;
    size_t need = (size_t)(pairs * parts * (heads / kv_heads) * (d + 2)) * sizeof(float) + 64;
    if (!lc_grow(&lc_att, &lc_att_size, need)) return LC_ENOMEM;
#define LC_ATT_ARGS                                                                                              \
    q, q_bf16, rows, heads, kv_heads, d, cache, cache_type, scales, num_slots, tables, max_blocks, seq_lens, block_size, \
        scale, window, softcap, out, out_bf16, nth, parts, (float *)lc_att
#ifdef LC_X86
    if (isa == LC_ISA_AVX512VNNI) {
        decode_attention_avx512vnni(LC_ATT_ARGS);
        return 0;
    }
    if (isa == LC_ISA_AVX2) {
        decode_attention_avx2(LC_ATT_ARGS);
        return 0;
    }
#endif
    decode_attention_portable(LC_ATT_ARGS);
    return 0;
#undef LC_ATT_ARGS
}

/* The ISA variant `isa` of a fused step (lc_fused.h): each is plain C vectorized per target. */
#ifdef LC_X86
#define LC_DISPATCH(fn, ...)                                                                                     \
    do {                                                                                                         \
        if (isa == LC_ISA_AVX512VNNI) fn##_avx512vnni(__VA_ARGS__);                                              \
        else if (isa == LC_ISA_AVX2) fn##_avx2(__VA_ARGS__);                                                     \
        else fn##_portable(__VA_ARGS__);                                                                         \
    } while (0)
#else
#define LC_DISPATCH(fn, ...) fn##_portable(__VA_ARGS__)
#endif

/* RMSNorm over rows of n (float32, or bfloat16 if bf16; w in the same type, or NULL for none):
   out = x * rsqrt(mean(x^2) + eps) * w. With `sum` non-NULL the row normalized is x + sum, stored back
   into sum (the residual add before a norm, in one pass). */
LC_EXPORT int lc_rms_norm(int isa, const void *x, void *sum, int bf16, int64_t rows, int64_t n, const void *w,
                          float eps, void *out, int nth) {
    if (!lc_isa_supported(isa) || rows < 0 || n < 1 || nth < 1) return -1;
    LC_DISPATCH(rms_norm, x, sum, bf16, rows, n, w, eps, out, nth);
    return 0;
}

/* out [rows, inter] = silu(gate) * up of gate_up [rows, 2 * inter] (gate | up, fused at load). */
LC_EXPORT int lc_swiglu(int isa, const void *gate_up, int bf16, int64_t rows, int64_t inter, void *out, int nth) {
    if (!lc_isa_supported(isa) || rows < 0 || inter < 1 || nth < 1) return -1;
    LC_DISPATCH(swiglu, gate_up, bf16, rows, inter, out, nth);
    return 0;
}

/* Per-thread rotated queries of lc_decode_rope_attention (the caller's thread), grown by lc_grow. */
LC_SCRATCH(lc_rq);

/* A decode step's attention for one layer from the projections: RoPE on q and k (lc_fused.h's
   rope_write; qk [rows, heads + kv_heads, d] and v [rows, kv_heads, d] in the compute type, row
   strides in elements, cos/sin [rows, d] in it too), k and v written into a float32 or bfloat16 cache
   at slots[rows], then lc_decode_attention over the cache (which now holds this step's keys). */
LC_EXPORT int lc_decode_rope_attention(int isa, const void *qk, int64_t qk_stride, const void *v, int64_t v_stride,
                                       int bf16, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                                       const void *cos, const void *sin, const int64_t *slots, void *cache,
                                       int cache_type, int64_t num_slots, const int64_t *tables,
                                       int64_t max_blocks, const int64_t *seq_lens, int64_t block_size, float scale,
                                       int64_t window, float softcap, void *out, int nth) {
    if (!lc_isa_supported(isa) || rows < 0 || kv_heads < 1 || d < 2 || d % 2 || heads < kv_heads ||
        (cache_type != LC_KV_F32 && cache_type != LC_KV_BF16) || qk_stride < (heads + kv_heads) * d ||
        v_stride < kv_heads * d)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        if (slots[r] < 0 || slots[r] >= num_slots) return -1;
    size_t need = (size_t)(rows * heads * d) * (bf16 ? 2 : 4) + 64;
    if (!lc_grow(&lc_rq, &lc_rq_size, need)) return LC_ENOMEM;
    LC_DISPATCH(rope_write, qk, qk_stride, v, v_stride, bf16, rows, heads, kv_heads, d, cos, sin, slots, cache,
                cache_type == LC_KV_BF16, num_slots, lc_rq);
    return lc_decode_attention(isa, lc_rq, bf16, rows, heads, kv_heads, d, cache, cache_type, NULL, num_slots,
                               tables, max_blocks, seq_lens, block_size, scale, window, softcap, out, bf16, nth);
}

#include "lc_step.h"
#include "lc_deltanet.h" /* LC_FN undefined: the export */

#ifndef LC_NO_PYTHON
/* Importable as a module only so that setuptools can build it everywhere; the API is the C one. */
static struct PyModuleDef lc_module = {PyModuleDef_HEAD_INIT, "_lckernels", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lckernels(void) { return PyModule_Create(&lc_module); }
#endif
