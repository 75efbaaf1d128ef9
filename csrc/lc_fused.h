/* Fused elementwise steps of a decoder layer, one ISA variant (lc_kernels.c includes this file once per
target after lc_attention.h, LC_FN naming its functions): RMSNorm with the residual add before it,
SwiGLU, and RoPE with the KV-cache write in front of decode attention.

Each replaces several small torch ops whose fixed cost (5-25 us each on a 2-core CPU) dominates a
decode step of a small model. The numerics follow the torch ops they replace, bfloat16 roundings
included (a value the torch path rounds to bfloat16 between two ops is rounded here too), so the C
and torch paths agree to the last bit in all but rare ties of the float32 sums. */

#ifndef LC_FUSED_SHARED
#define LC_FUSED_SHARED
/* v as float32, or rounded through bfloat16 (what storing and reloading a bf16 tensor gives). */
static inline float lc_round_as(float v, int bf16) { return bf16 ? lc_bf16(lc_to_bf16(v)) : v; }
static inline float lc_load(const void *p, int bf16, int64_t i) {
    return bf16 ? lc_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
#endif

/* One row of rms_norm in the compute type T (float32 or bfloat16 bits): the dtype branches sit outside
   the loops, so the compiler vectorizes the add and the normalize loops on every ISA (the per-element
   branch of lc_load / lc_store kept them scalar). The sum of squares stays one running sum in element
   order: a lane-split sum is ~1 us a row faster but rounds differently, and the real Qwen2.5-1.5B's
   greedy tokens then changed (the 15th of a 128-token reply). */
#define LC_RMS_ROW(NAME, T, LOAD, STORE)                                                                  \
    static inline void LC_FN(NAME)(const T *x, T *sum, int64_t n, const T *w, float eps, T *out) {         \
        const T *src = sum ? sum : x;                                                                      \
        if (sum)                                                                                           \
            for (int64_t j = 0; j < n; j++) { /* sum = x + sum, rounded as the torch path's tensor */      \
                float v = LOAD(x[j]) + LOAD(sum[j]);                                                       \
                sum[j] = STORE(v);                                                                         \
            }                                                                                              \
        float ss = 0.0f;                                                                                   \
        for (int64_t j = 0; j < n; j++) {                                                                  \
            float v = LOAD(src[j]);                                                                        \
            ss += v * v;                                                                                   \
        }                                                                                                  \
        const float rstd = 1.0f / sqrtf(ss / (float)n + eps);                                              \
        if (w)                                                                                             \
            for (int64_t j = 0; j < n; j++) out[j] = STORE(LOAD(STORE(LOAD(src[j]) * rstd)) * LOAD(w[j])); \
        else                                                                                               \
            for (int64_t j = 0; j < n; j++) out[j] = STORE(LOAD(src[j]) * rstd);                           \
    }
#define LC_RMS_F32(v) (v)
LC_RMS_ROW(rms_row_f32, float, LC_RMS_F32, LC_RMS_F32)
LC_RMS_ROW(rms_row_bf16, uint16_t, lc_bf16, lc_to_bf16)
#undef LC_RMS_F32
#undef LC_RMS_ROW

/* out = x * rsqrt(mean(x^2) + eps) * w per row of n; with `sum` set, x is first replaced by
   sum = x + sum (written back into sum, as the torch path's `x + delta` makes a new tensor). As torch in
   bfloat16: the normalized value is rounded before the weight multiplies it. */
static void LC_FN(rms_norm)(const void *x, void *sum, int bf16, int64_t rows, int64_t n, const void *w,
                            float eps, void *out, int nth) {
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (rows * n >= 262144)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = r * n;
        if (bf16)
            LC_FN(rms_row_bf16)((const uint16_t *)x + base, sum ? (uint16_t *)sum + base : NULL, n,
                                (const uint16_t *)w, eps, (uint16_t *)out + base);
        else
            LC_FN(rms_row_f32)((const float *)x + base, sum ? (float *)sum + base : NULL, n, (const float *)w, eps,
                               (float *)out + base);
    }
}

#if LC_ISA == LC_ISA_AVX512VNNI
/* One bfloat16 row of swiglu, 16 values a round (the scalar loop finishes a tail): lc_exp's steps on
   16 lanes (att_exp16) and the same roundings, so a prefill's 8k-wide rows stay cheap. */
static inline int64_t LC_FN(swiglu_row_bf16)(const uint16_t *g, const uint16_t *u, uint16_t *o, int64_t inter) {
    int64_t j = 0;
    for (; j + 16 <= inter; j += 16) {
        __m512 gv = LC_FN(att_bf16x16)(g + j), uv = LC_FN(att_bf16x16)(u + j);
        __m512 act = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), LC_FN(att_exp16)(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        act = _mm512_castsi512_ps(_mm512_slli_epi32(LC_FN(bf16_bits16)(act), 16)); /* lc_x16_avx512.h */
        _mm256_storeu_si256((__m256i *)(o + j), _mm512_cvtepi32_epi16(LC_FN(bf16_bits16)(_mm512_mul_ps(act, uv))));
    }
    return j;
}
#endif

/* out [rows, inter] = silu(gate) * up for gate_up [rows, 2 * inter] (gate | up): silu rounded first in
   bfloat16, as F.silu's output tensor is. */
static void LC_FN(swiglu)(const void *gate_up, int bf16, int64_t rows, int64_t inter, void *out, int nth) {
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (rows * inter >= 262144)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g0 = r * 2 * inter, u0 = g0 + inter;
        int64_t from = 0;
#if LC_ISA == LC_ISA_AVX512VNNI
        if (bf16) {
            const uint16_t *gu = (const uint16_t *)gate_up;
            from = LC_FN(swiglu_row_bf16)(gu + g0, gu + u0, (uint16_t *)out + r * inter, inter);
        }
#endif
        for (int64_t j = from; j < inter; j++) {
            float g = lc_load(gate_up, bf16, g0 + j);
            float act = lc_round_as(g / (1.0f + lc_exp(-g)), bf16);
            lc_store(out, bf16, r * inter + j, act * lc_load(gate_up, bf16, u0 + j));
        }
    }
}

/* RoPE (rotate-half form: y = x * cos + cat(x2, x1) * sin_signed, cos/sin [rows, d] as layers.Rotary
   builds them) on q and k of each decode row; rotated q heads go to q_out [rows, heads, d], rotated k
   and the row's v into the cache (float32 or bfloat16 by cache_bf16) at slots[row]. qk [rows, heads +
   kv_heads, d] and v [rows, kv_heads, d] have row strides qk_stride / v_stride elements. */
#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
/* n values of one bfloat16 head into a bfloat16 destination: y = round(x * c) + x2 * s in one FMA, as the
   generic loop below computes them, in a loop of plain arrays the compiler vectorizes (the generic one,
   with its type tests and its (j + half) % d per value, took ~9 us a layer of a 1.5B model's decode). */
static inline void LC_FN(rope_bf16)(const uint16_t *x, const uint16_t *x2, const uint16_t *c, const uint16_t *s,
                                    uint16_t *out, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        out[j] = lc_to_bf16(fmaf(lc_bf16(x2[j]), lc_bf16(s[j]), lc_bf16(lc_to_bf16(lc_bf16(x[j]) * lc_bf16(c[j])))));
}
#endif

static void LC_FN(rope_write)(const void *qk, int64_t qk_stride, const void *v, int64_t v_stride, int bf16,
                              int64_t rows, int64_t heads, int64_t kv_heads, int64_t d, const void *cos,
                              const void *sin, const int64_t *slots, void *cache, int cache_bf16,
                              int64_t num_slots, void *q_out) {
    const int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            const int64_t src = r * qk_stride + h * d;
            void *dst = h < heads ? q_out : cache;
            int dst_bf16 = h < heads ? bf16 : cache_bf16;
            int64_t d0 = h < heads ? (r * heads + h) * d : ((h - heads) * num_slots + slots[r]) * d;
#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
            if (bf16 && dst_bf16) { /* the rotated halves: x2 is the other half */
                const uint16_t *x = (const uint16_t *)qk + src, *c = (const uint16_t *)cos + r * d,
                               *s = (const uint16_t *)sin + r * d;
                uint16_t *o = (uint16_t *)dst + d0;
                LC_FN(rope_bf16)(x, x + half, c, s, o, half);
                LC_FN(rope_bf16)(x + half, x, c + half, s + half, o + half, d - half);
                continue;
            }
#endif
            for (int64_t j = 0; j < d; j++) {
                float a = lc_round_as(lc_load(qk, bf16, src + j) * lc_load(cos, bf16, r * d + j), bf16);
                const float x2 = lc_load(qk, bf16, src + (j + half) % d), s = lc_load(sin, bf16, r * d + j);
#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
                /* one rounding, as torch.addcmul's AVX2 / AVX-512 kernels give (an FMA; left to the
                   compiler, the contraction could fuse x * cos instead: float32 rows then differed) */
                float y = fmaf(x2, s, a);
#else
                /* two roundings, as torch's default-capability kernel (no FMA) gives; volatile keeps a
                   compiler for an FMA target (aarch64) from contracting either product into the sum */
                volatile float kept = a, turned = x2 * s;
                float y = kept + turned;
#endif
                lc_store(dst, dst_bf16, d0 + j, lc_round_as(y, bf16));
            }
        }
        for (int64_t h = 0; h < kv_heads; h++) { /* V half of the cache: [1, kv_heads, num_slots, d] */
            int64_t d0 = ((kv_heads + h) * num_slots + slots[r]) * d;
            if (bf16 && cache_bf16) { /* bfloat16 to bfloat16 keeps every bit (NaN payloads too) */
                memcpy((uint16_t *)cache + d0, (const uint16_t *)v + r * v_stride + h * d, (size_t)d * 2);
                continue;
            }
            for (int64_t j = 0; j < d; j++)
                lc_store(cache, cache_bf16, d0 + j, lc_load(v, bf16, r * v_stride + h * d + j));
        }
    }
}
