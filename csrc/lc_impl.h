/* One ISA variant of the kernels: lc_kernels.c includes this file once per target with LC_ISA set
(LC_ISA_PORTABLE, LC_ISA_AVX2, LC_ISA_AVX512VNNI) and LC_FN(name) naming its functions.

Every variant quantizes activations (`quantize`). Only the portable one multiplies GGUF-layout blocks
(`matmul`, `dequant`): the reference the x16 kernels are checked against, and what `LOCALCHAT_KERNEL_LAYOUT=gguf`,
the i-quant-free ISAs without x16 kernels and embedding lookups run. The SIMD ISAs read every legacy and
K-quant matrix in the x16 layout instead (lc_x16_avx512.h, lc_x16_avx2.h, lc_x16_neon.h). */

#if LC_ISA == LC_ISA_PORTABLE
#include "lc_decode.h"
#endif

#if LC_ISA == LC_ISA_AVX512VNNI || LC_ISA == LC_ISA_AVX2
/* Horizontal sum of 8 floats (lc_iquants.h). */
static inline float LC_FN(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#if LC_ISA == LC_ISA_AVX512VNNI
/* One 32-value block of quantize in registers (the same numbers as the plain loop below: amax / 127,
   round half to even, clamp), which gcc left as serial scalar maxima and per-value stores: about 3 ns a
   value, a tenth of a 16-row matmul's time. */
static inline void LC_FN(quantize32)(const void *src, int x_bf16, int8_t *q, float *xd8, float *xs2, int32_t *nl) {
    __m512 v0, v1;
    if (x_bf16) {
        const __m256i *h = (const __m256i *)src;
        v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h)), 16));
        v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h + 1)), 16));
    } else {
        v0 = _mm512_loadu_ps((const float *)src);
        v1 = _mm512_loadu_ps((const float *)src + 16);
    }
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f), idv = _mm512_set1_ps(id);
    const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512i i0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(v0, idv), round), lo), hi));
    __m512i i1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(v1, idv), round), lo), hi));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(i1));
    _mm256_storeu_ps(xd8, _mm256_set1_ps(d));
    xs2[0] = d * (float)_mm512_reduce_add_epi32(i0);
    xs2[1] = d * (float)_mm512_reduce_add_epi32(i1);
    /* each 128-bit lane holds one 4-value lane: two in-lane shuffles leave its sum in every dword */
    int32_t sums[32];
    for (int h = 0; h < 2; h++) {
        __m512i v = h ? i1 : i0;
        v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
        v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
        _mm512_storeu_si512((void *)(sums + 16 * h), v);
    }
    for (int l = 0; l < 8; l++) nl[l] = -sums[4 * l];
}
#endif

static void LC_FN(quantize)(const void *x, int x_bf16, int64_t t, int64_t k, int64_t ldx, int8_t *xq,
                            float *xd, float *xs, int nth) {
    int64_t subs = k / 32;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static) if (t * k >= 65536)
#endif
    for (int64_t r = 0; r < t; r++) {
        float v[32];
        for (int64_t b = 0; b < subs; b++) {
#if LC_ISA == LC_ISA_AVX512VNNI
            const char *src = (const char *)x + (size_t)(r * ldx + 32 * b) * (x_bf16 ? 2 : 4);
            LC_FN(quantize32)(src, x_bf16, xq + r * k + 32 * b, xd + r * (k / 4) + 8 * b, xs + r * LC_XS(k) + 2 * b,
                              (int32_t *)(xs + r * LC_XS(k) + k / 16) + 8 * b);
            (void)v;
            continue;
#endif
            if (x_bf16) {
                const uint16_t *src = (const uint16_t *)x + r * ldx + 32 * b;
                for (int j = 0; j < 32; j++) v[j] = lc_bf16(src[j]);
            } else {
                const float *src = (const float *)x + r * ldx + 32 * b;
                for (int j = 0; j < 32; j++) v[j] = src[j];
            }
            /* 8 running maxima the compiler keeps in one vector, then 8 compares: a plain max over 32 was a
               serial chain of scalar maxss (fmaxf, a libm call per value), most of the function's time */
            float m8[8] = {0, 0, 0, 0, 0, 0, 0, 0}, amax = 0.0f;
            for (int j = 0; j < 32; j += 8)
                for (int l = 0; l < 8; l++) {
                    float a = fabsf(v[j + l]);
                    m8[l] = a > m8[l] ? a : m8[l];
                }
            for (int l = 0; l < 8; l++) amax = m8[l] > amax ? m8[l] : amax;
            float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            int8_t *q = xq + r * k + 32 * b;
            int32_t lo = 0, hi = 0;
            for (int j = 0; j < 32; j++) {
                float s = nearbyintf(v[j] * id);
                s = s > 127.0f ? 127.0f : (s < -127.0f ? -127.0f : s);
                q[j] = (int8_t)s;
                if (j < 16) lo += q[j]; else hi += q[j];
            }
            for (int l = 0; l < 8; l++) xd[r * (k / 4) + 8 * b + l] = d;
            xs[r * LC_XS(k) + 2 * b] = d * (float)lo;
            xs[r * LC_XS(k) + 2 * b + 1] = d * (float)hi;
            int32_t *nl = (int32_t *)(xs + r * LC_XS(k) + k / 16) + 8 * b; /* minus each lane's sum */
            for (int l = 0; l < 8; l++) nl[l] = -(q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
        }
    }
}

#if LC_ISA == LC_ISA_PORTABLE
/* The GGUF-layout reference: rows decoded by lc_decode.h into codes, lane scales and offsets, then
   4 x 2 tiles (activation rows x decoded weight rows) of integer dot products. */
#define LC_TILE_MR 4
#define LC_TILE_N 16 /* weight rows decoded per tile (4 for few-row steps, so both threads get work) */

static inline void LC_FN(micro)(
    const int mr, const int nr, const int wide, const uint8_t *c, const float *ls, int64_t k,
    const int8_t *xq, const float *xd, float res[4][2]) {
    (void)wide;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float acc = 0.0f;
            const int8_t *x = xq + i * k;
            const uint8_t *cj = c + j * k;
            for (int64_t l = 0; l < k / 4; l++) {
                int32_t s = 0;
                for (int m = 0; m < 4; m++) s += (int32_t)cj[4 * l + m] * (int32_t)x[4 * l + m];
                acc += ls[j * (k / 4) + l] * xd[i * (k / 4) + l] * (float)s;
            }
            res[i][j] = acc;
        }
}

/* sum(a[i] * b[i]): the offsets times the activation sums, once per output (n = k / 16). */
static inline float LC_FN(dotf)(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void LC_FN(rows)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                        const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                        int out_bf16, int64_t ldo, uint8_t *c, float *ls, float *mc) {
    int wide = type == LC_Q8_0;
    for (int64_t n = n0; n < n1; n++)
        LC_FN(decode_row)(type, w + n * row_bytes, k, c + (n - n0) * k, ls + (n - n0) * (k / 4),
                          mc + (n - n0) * (k / 16));
    for (int64_t t0 = 0; t0 < t; t0 += LC_TILE_MR) {
        int mr = (int)(t - t0 < LC_TILE_MR ? t - t0 : LC_TILE_MR);
        const int8_t *xt = xq + t0 * k;
        const float *dt = xd + t0 * (k / 4);
        for (int64_t n = n0; n < n1; n += 2) {
            int nr = n + 1 < n1 ? 2 : 1;
            const uint8_t *cn = c + (n - n0) * k;
            const float *ln = ls + (n - n0) * (k / 4);
            float res[4][2];
            if (mr == 4 && nr == 2 && !wide) LC_FN(micro)(4, 2, 0, cn, ln, k, xt, dt, res);
            else if (mr == 4 && nr == 2) LC_FN(micro)(4, 2, 1, cn, ln, k, xt, dt, res);
            else LC_FN(micro)(mr, nr, wide, cn, ln, k, xt, dt, res);
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) {
                    const float *mn = mc + (n + j - n0) * (k / 16);
                    float v = res[i][j] + LC_FN(dotf)(mn, xs + (t0 + i) * LC_XS(k), k / 16);
                    lc_store(out, out_bf16, (t0 + i) * ldo + n + j, v);
                }
        }
    }
}

/* LC_ENOMEM when a thread's decode buffer cannot grow (that thread skips its tiles: out is then unusable). */
static int LC_FN(matmul)(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes,
                         const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                         int out_bf16, int64_t ldo, int nth) {
    /* Weight rows are decoded once per tile and reused by every activation row (the tile stays in L2). */
    int64_t tile = t <= LC_TILE_MR ? 4 : LC_TILE_N;
    int64_t tiles = (n + tile - 1) / tile;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nth) reduction(| : failed)
#endif
    {
        uint8_t *c = NULL;
        float *ls = NULL, *mc = NULL;
        int ok = lc_scratch(tile * k, &c, &ls, &mc) == LC_OK;
        failed |= !ok;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < tiles; i++) {
            int64_t n0 = i * tile, n1 = n0 + tile < n ? n0 + tile : n;
            if (ok) LC_FN(rows)(type, w, n0, n1, k, row_bytes, xq, xd, xs, t, out, out_bf16, ldo, c, ls, mc);
        }
    }
    return failed ? LC_ENOMEM : LC_OK;
}

static void LC_FN(dequant)(int type, const uint8_t *w, int64_t k, int64_t row_bytes, const int64_t *ids,
                           int64_t r, void *out, int out_bf16) {
    uint8_t c[32];
    float ls[8], mc[2];
    for (int64_t i = 0; i < r; i++) {
        const uint8_t *row = w + ids[i] * row_bytes;
        for (int64_t s = 0; s < k / 32; s++) {
            switch (type) {
            case LC_Q4_0: LC_FN(dec_q4_0)(row + 18 * s, c, ls, mc); break;
            case LC_Q4_1: LC_FN(dec_q4_1)(row + 20 * s, c, ls, mc); break;
            case LC_Q5_0: LC_FN(dec_q5_0)(row + 22 * s, c, ls, mc); break;
            case LC_Q5_1: LC_FN(dec_q5_1)(row + 24 * s, c, ls, mc); break;
            case LC_Q8_0: LC_FN(dec_q8_0)(row + 34 * s, c, ls, mc); break;
            case LC_Q2_K: LC_FN(dec_q2_k)(row + 84 * (s / 8), (int)(s % 8), c, ls, mc); break;
            case LC_Q3_K: LC_FN(dec_q3_k)(row + 110 * (s / 8), (int)(s % 8), c, ls, mc); break;
            case LC_Q4_K: LC_FN(dec_q4_k)(row + 144 * (s / 8), (int)(s % 8), c, ls, mc); break;
            case LC_Q5_K: LC_FN(dec_q5_k)(row + 176 * (s / 8), (int)(s % 8), c, ls, mc); break;
            default: LC_FN(dec_q6_k)(row + 210 * (s / 8), (int)(s % 8), c, ls, mc); break;
            }
            for (int j = 0; j < 32; j++)
                lc_store(out, out_bf16, i * k + 32 * s + j, ls[j / 4] * (float)c[j] + mc[j / 16]);
        }
    }
}
#endif
