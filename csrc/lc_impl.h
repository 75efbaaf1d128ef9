/* One ISA variant of the kernels: lc_kernels.c includes this file once per target with LC_ISA set
(LC_ISA_PORTABLE, LC_ISA_AVX2, LC_ISA_AVX512VNNI) and LC_FN(name) naming its functions. */

#include "lc_decode.h"

#if LC_ISA == LC_ISA_AVX512VNNI || LC_ISA == LC_ISA_AVX2
static inline float LC_FN(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 int32 lanes, lane l = sum of codes[4l..4l+3] * x[4l..4l+3] (codes unsigned, x signed). */
static inline __m256i LC_FN(dot8)(__m256i c, __m256i x, int wide) {
#if LC_ISA == LC_ISA_AVX512VNNI
    (void)wide;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x);
#else
    /* maddubs saturates its int16 pair sums: exact only for codes < 128, so codes >= 128 (Q8_0)
       take their top bit through a second product (128 * 127 * 2 still fits). */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i low = _mm256_and_si256(c, _mm256_set1_epi8(0x7F));
    __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(low, x), ones);
    if (wide) {
        __m256i top = _mm256_and_si256(c, _mm256_set1_epi8((char)0x80));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(top, x), ones));
    }
    return sum;
#endif
}

/* res[i] = sum_blocks dx[i][b] * sum_lanes(lscale * dot8(codes, xq[i])) for MR activation rows. */
static inline __attribute__((always_inline)) void LC_FN(micro)(
    const int mr, const int wide, const uint8_t *c, const float *ls, const int8_t *xq, const float *xd,
    int64_t k, float *res) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t subs = k / 32;
    for (int64_t b = 0; b < subs; b++) {
        __m256i cv = _mm256_loadu_si256((const __m256i *)(c + 32 * b));
        __m256 lv = _mm256_loadu_ps(ls + 8 * b);
        for (int i = 0; i < mr; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * k + 32 * b));
            __m256 f = _mm256_mul_ps(lv, _mm256_set1_ps(xd[i * subs + b]));
            acc[i] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(LC_FN(dot8)(cv, xv, wide)), acc[i]);
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum)(acc[i]);
}
#else
static inline void LC_FN(micro)(
    const int mr, const int wide, const uint8_t *c, const float *ls, const int8_t *xq, const float *xd,
    int64_t k, float *res) {
    (void)wide;
    int64_t subs = k / 32;
    for (int i = 0; i < mr; i++) {
        float acc = 0.0f;
        const int8_t *x = xq + i * k;
        for (int64_t b = 0; b < subs; b++) {
            float part = 0.0f;
            for (int l = 0; l < 8; l++) {
                int32_t s = 0;
                for (int j = 0; j < 4; j++) s += (int32_t)c[32 * b + 4 * l + j] * (int32_t)x[32 * b + 4 * l + j];
                part += ls[8 * b + l] * (float)s;
            }
            acc += xd[i * subs + b] * part;
        }
        res[i] = acc;
    }
}
#endif

/* sum(a[n] * b[n]) in 8 partial sums (vectorizable without reassociation flags). */
static inline float LC_FN(dotf)(const float *a, const float *b, int64_t n) {
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) p[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int l = 0; l < 8; l++) s += p[l];
    return s;
}

static void LC_FN(quantize)(const void *x, int x_bf16, int64_t t, int64_t k, int64_t ldx, int8_t *xq,
                            float *xd, float *xs, int nth) {
    int64_t subs = k / 32;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static) if (t * k >= 65536)
#endif
    for (int64_t r = 0; r < t; r++) {
        float v[32];
        for (int64_t b = 0; b < subs; b++) {
            if (x_bf16) {
                const uint16_t *src = (const uint16_t *)x + r * ldx + 32 * b;
                for (int j = 0; j < 32; j++) v[j] = lc_bf16(src[j]);
            } else {
                const float *src = (const float *)x + r * ldx + 32 * b;
                for (int j = 0; j < 32; j++) v[j] = src[j];
            }
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
            float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            int8_t *q = xq + r * k + 32 * b;
            int32_t lo = 0, hi = 0;
            for (int j = 0; j < 32; j++) {
                float s = nearbyintf(v[j] * id);
                s = s > 127.0f ? 127.0f : (s < -127.0f ? -127.0f : s);
                q[j] = (int8_t)s;
                if (j < 16) lo += q[j]; else hi += q[j];
            }
            xd[r * subs + b] = d;
            xs[r * 2 * subs + 2 * b] = d * (float)lo;
            xs[r * 2 * subs + 2 * b + 1] = d * (float)hi;
        }
    }
}

#define LC_TILE_MR 4

static void LC_FN(rows)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                        const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                        int out_bf16, int64_t ldo, uint8_t *c, float *ls, float *mc) {
    int wide = type == LC_Q8_0;
    int64_t subs = k / 32;
    for (int64_t n = n0; n < n1; n++)
        LC_FN(decode_row)(type, w + n * row_bytes, k, c + (n - n0) * k, ls + (n - n0) * (k / 4),
                          mc + (n - n0) * (k / 16));
    for (int64_t t0 = 0; t0 < t; t0 += LC_TILE_MR) {
        int mr = (int)(t - t0 < LC_TILE_MR ? t - t0 : LC_TILE_MR);
        const int8_t *xt = xq + t0 * k;
        const float *dt = xd + t0 * subs;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *cn = c + (n - n0) * k;
            const float *ln = ls + (n - n0) * (k / 4), *mn = mc + (n - n0) * (k / 16);
            float res[LC_TILE_MR];
            /* literal row counts so the micro kernel's loops unroll */
            switch (mr * 2 + wide) {
            case 2: LC_FN(micro)(1, 0, cn, ln, xt, dt, k, res); break;
            case 3: LC_FN(micro)(1, 1, cn, ln, xt, dt, k, res); break;
            case 4: LC_FN(micro)(2, 0, cn, ln, xt, dt, k, res); break;
            case 5: LC_FN(micro)(2, 1, cn, ln, xt, dt, k, res); break;
            case 6: LC_FN(micro)(3, 0, cn, ln, xt, dt, k, res); break;
            case 7: LC_FN(micro)(3, 1, cn, ln, xt, dt, k, res); break;
            case 8: LC_FN(micro)(4, 0, cn, ln, xt, dt, k, res); break;
            default: LC_FN(micro)(4, 1, cn, ln, xt, dt, k, res); break;
            }
            for (int i = 0; i < mr; i++) {
                float v = res[i] + LC_FN(dotf)(mn, xs + (t0 + i) * (k / 16), k / 16);
                lc_store(out, out_bf16, (t0 + i) * ldo + n, v);
            }
        }
    }
}

static void LC_FN(matmul)(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes,
                          const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                          int out_bf16, int64_t ldo, int nth) {
    /* Weight rows are decoded once per tile and reused by every activation row (the tile stays in
       L2); few-row steps take small tiles so both threads get work. */
    int64_t tile = t <= LC_TILE_MR ? 4 : 16;
    int64_t tiles = (n + tile - 1) / tile;
#ifdef _OPENMP
#pragma omp parallel num_threads(nth)
#endif
    {
        uint8_t *c;
        float *ls, *mc;
        lc_scratch(tile * k, &c, &ls, &mc);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < tiles; i++) {
            int64_t n0 = i * tile, n1 = n0 + tile < n ? n0 + tile : n;
            LC_FN(rows)(type, w, n0, n1, k, row_bytes, xq, xd, xs, t, out, out_bf16, ldo, c, ls, mc);
        }
    }
}

#if LC_ISA == LC_ISA_PORTABLE
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
