/* localchat's CPU kernels: the exported C API, one declaration per function.

lc_kernels.c includes this header before defining them and so do the C test harnesses in tests/c/, so a
signature that changes on one side and not the other stops the build instead of corrupting memory at run
time. localchat/kernels/library.py sets the same signatures for ctypes, in the same order, and
localchat/kernels/step.py mirrors the structs below (their sizes are asserted on both sides).

Every function returns LC_OK on success, LC_EINVAL on a bad argument or shape, or LC_ENOMEM when a
scratch buffer cannot grow (all of them grow through lc_grow: no write through a NULL buffer; the outputs
are unusable then, and the Python side raises InsufficientMemoryError); lc_x16_bytes returns a size or -1,
and the lc_isa_* / lc_openmp / lc_x16_supported queries 0 or 1. */
#ifndef LC_KERNELS_H
#define LC_KERNELS_H

#include <stdint.h>

#ifndef LC_EXPORT
#ifdef _MSC_VER
#define LC_EXPORT __declspec(dllexport)
#else
#define LC_EXPORT __attribute__((visibility("default")))
#endif
#endif

/* Results (library.py raises a typed error for each failure). */
#define LC_OK 0
#define LC_EINVAL (-1)
#define LC_ENOMEM (-2)

/* GGML type ids, as in GGUF files (localchat/kernels/blocks.py has their block geometry). */
enum {
    LC_Q4_0 = 2, LC_Q4_1 = 3, LC_Q5_0 = 6, LC_Q5_1 = 7, LC_Q8_0 = 8,
    LC_Q2_K = 10, LC_Q3_K = 11, LC_Q4_K = 12, LC_Q5_K = 13, LC_Q6_K = 14,
    /* i-quants and ternary types (lc_iquants.h): no x16 layout, their own matmul */
    LC_IQ2_XXS = 16, LC_IQ2_XS = 17, LC_IQ3_XXS = 18, LC_IQ1_S = 19, LC_IQ4_NL = 20, LC_IQ3_S = 21,
    LC_IQ2_S = 22, LC_IQ4_XS = 23, LC_IQ1_M = 29, LC_TQ1_0 = 34, LC_TQ2_0 = 35,
    LC_MXFP4 = 39, /* lc_mxfp4.h: run by the i-quant kernels */
    LC_NVFP4 = 40, LC_Q1_0 = 41, LC_Q2_0 = 42 /* lc_lowbit.h: run by the i-quant kernels */
};
#define LC_X16 0x100 /* type flag: the matrix is in the x16 layout (lc_x16_layout.h) */

/* ISA ids (localchat/cpu_features.py's KERNEL_ISAS order). Macros, not an enum: lc_impl.h tests them
   with #if. */
#define LC_ISA_PORTABLE 0
#define LC_ISA_AVX2 1
#define LC_ISA_AVX512VNNI 2
#define LC_ISA_NEON 3 /* aarch64 with the dot product (Armv8.2 sdot): x16 kernels, i-quants; the rest portable C */

/* KV cache element types (the torch backend's kernels.py mirrors them). */
#define LC_KV_F32 0
#define LC_KV_BF16 1
#define LC_KV_INT8 2

/* The fused decode step's layer table (lc_step.h). */
#define LC_STEP_MAX_SEG 4 /* typed row segments per matrix (a fused q|k|v of three types needs 3) */

/* One matrix's segments, as lc_linear takes them. */
typedef struct {
    int32_t nseg;
    int32_t types[LC_STEP_MAX_SEG];
    uint64_t ptrs[LC_STEP_MAX_SEG];
    int64_t rows[LC_STEP_MAX_SEG];
    int64_t row_bytes[LC_STEP_MAX_SEG];
} lc_step_matrix;

/* One layer's weights. Norm weights and biases are in the compute type; a bias address of 0 means none. */
typedef struct {
    uint64_t attn_norm, mlp_norm, qkv_bias, o_bias;
    lc_step_matrix qkv, o, gate_up, down;
} lc_step_layer;

#define LC_STEP_MAX_AUX 8 /* layer inputs one step can copy out (an EAGLE-3 head reads three) */

/* lc_decode_layers' arguments, one struct passed by pointer (26 positional ones were easy to misorder).
   Addresses are uint64_t as in lc_step_layer; lc_step.h says what each array holds. */
typedef struct {
    uint64_t layers;                 /* const lc_step_layer [nlayers] */
    uint64_t caches;                 /* const uint64_t [nlayers]: each layer's KV cache */
    uint64_t x;                      /* [rows, hidden], updated in place */
    uint64_t cos, sin;               /* [rows, d] in the compute type */
    uint64_t slots;                  /* int64 [rows] */
    uint64_t tables;                 /* int64 [rows, max_blocks] */
    uint64_t seq_lens;               /* int64 [rows] */
    uint64_t aux;                    /* [rows, naux * hidden] in the compute type, or 0 when naux is 0 */
    int64_t num_slots, rows, hidden, heads, kv_heads, d, inter, max_blocks, block_size, window;
    float eps, scale;
    int32_t isa, nlayers, cache_type, bf16, precise, nth;
    int32_t naux;                    /* 0..LC_STEP_MAX_AUX */
    int32_t aux_layers[LC_STEP_MAX_AUX]; /* 0..nlayers; nlayers: the last layer's output */
    int32_t reserved;                /* zero: pads the struct to a multiple of 8 on every ABI */
} lc_step_args;

/* step.py's StepMatrix, StepLayer and StepArgs assert these sizes too. */
_Static_assert(sizeof(lc_step_matrix) == 120, "lc_step_matrix: localchat/kernels/step.py mirrors 120 bytes");
_Static_assert(sizeof(lc_step_layer) == 512, "lc_step_layer: localchat/kernels/step.py mirrors 512 bytes");
_Static_assert(sizeof(lc_step_args) == 224, "lc_step_args: localchat/kernels/step.py mirrors 224 bytes");

/* CPU features and the build. */
LC_EXPORT int lc_isa_supported(int isa);
LC_EXPORT int lc_isa_best(void);
LC_EXPORT int lc_openmp(void);

/* 8-bit activations: x [t, k] (row stride ldx) -> xq, xd, xs (lc_kernels.c says their shapes). */
LC_EXPORT int lc_quantize(int isa, const void *x, int x_bf16, int64_t t, int64_t k, int64_t ldx, int8_t *xq,
                          float *xd, float *xs, int nth);

/* The x16 layout: which matrices it takes, their size, the repack. */
LC_EXPORT int lc_x16_supported(int isa, int type, int64_t k);
LC_EXPORT int64_t lc_x16_bytes(int type, int64_t n, int64_t k);
LC_EXPORT int lc_x16_repack(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out,
                            int nth);

/* Matrix products on block matrices: one typed matrix on quantized activations, or a whole linear. */
LC_EXPORT int lc_matmul(int isa, int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes,
                        const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out, int out_bf16,
                        int64_t ldo, int nth);
LC_EXPORT int lc_linear(int isa, const void *x, int x_bf16, int64_t t, int64_t k, int nseg, const int *types,
                        const uint64_t *ptrs, const int64_t *rows, const int64_t *row_bytes, int precise, void *out,
                        int out_bf16, int64_t ldo, int nth);
LC_EXPORT int lc_dequant_rows(int type, const uint8_t *w, int64_t k, int64_t row_bytes, const int64_t *ids,
                              int64_t r, void *out, int out_bf16);

/* Paged decode attention (lc_attention.h) and the fused layer steps (lc_fused.h, lc_step.h). */
LC_EXPORT int lc_decode_attention(int isa, const void *q, int q_bf16, int64_t rows, int64_t heads, int64_t kv_heads,
                                  int64_t d, const void *cache, int cache_type, const float *scales, int64_t num_slots,
                                  const int64_t *tables, int64_t max_blocks, const int64_t *seq_lens,
                                  int64_t block_size, float scale, int64_t window, float softcap, void *out,
                                  int out_bf16, int nth);
LC_EXPORT int lc_rms_norm(int isa, const void *x, void *sum, int bf16, int64_t rows, int64_t n, const void *w,
                          float eps, void *out, int nth);
LC_EXPORT int lc_swiglu(int isa, const void *gate_up, int bf16, int64_t rows, int64_t inter, void *out, int nth);
LC_EXPORT int lc_decode_rope_attention(int isa, const void *qk, int64_t qk_stride, const void *v, int64_t v_stride,
                                       int bf16, int64_t rows, int64_t heads, int64_t kv_heads, int64_t d,
                                       const void *cos, const void *sin, const int64_t *slots, void *cache,
                                       int cache_type, int64_t num_slots, const int64_t *tables, int64_t max_blocks,
                                       const int64_t *seq_lens, int64_t block_size, float scale, int64_t window,
                                       float softcap, void *out, int nth);
LC_EXPORT int lc_decode_layers(const lc_step_args *args);
/* Greedy sampling (lc_argmax.h): each row's float argmax from its 16- or 32-bit patterns (bfloat16 or
   float32), or -1 where the row holds a NaN or its maximum is not positive (the caller decides those). */
LC_EXPORT int lc_argmax_rows(const void *x, int bits, int64_t rows, int64_t n, int64_t *out);
LC_EXPORT int64_t lc_step_args_bytes(void); /* sizeof(lc_step_args): library.py refuses a stale build */

#endif
