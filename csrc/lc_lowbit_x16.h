/* Q1_0 and Q2_0 (lc_lowbit.h) in the x16 layout on AVX-512 VNNI (lc_x16_layout.h draws the units: 16 rows
in the file's bytes, 288 per 128 Q1_0 values or 64 Q2_0 ones: d[16] (f16), then 64-bit masks, bit 4c + b of
a mask = row c's value 4g + b of code group g; Q1_0 one mask per group (the sign bit), Q2_0 two (the code's
bit 0, bit 1)). A group's masks become its 16 rows' codes as bytes in one or two masked byte ops and feed
one vpdpbusd against 4 broadcast activations for all 16 rows; a 32-value sum is then 2 (bits . x) - sum(x)
for Q1_0's +-1, q . x - sum(x) for Q2_0's q - 1 (the activations' ns32), scaled by the rows' d times the
activations' scale once per 32. For Q1_0 the one-row loop (lc_lowbit_rows.h) ran 2.2x slower in
benchmarks/c/lowbit_x16_proto.c. Included by lc_x16_avx512.h before its x16_matmul, which hands these types
here; lc_x16_supported offers their x16 form on this ISA only. */

/* Q2_0 (same unit size for 64 values: d[16], then per 4 values two 64-bit masks, the codes' bit 0 and bit 1)
runs the same loops: codes b0 + 2 b1 in two masked byte ops, the 32-value sum (q - 1) . x = q . x - sum(x). */

/* Unit geometry: values per unit, and the codes (0/1, or 0..3) of code group g of a unit's masks m. */
#define LC_LBX_VALUES(type) ((type) == LC_Q1_0 ? 128 : 64)
static inline __attribute__((always_inline)) __m512i LC_FN(lbx_codes)(const int type, const uint64_t *m, int g) {
    const __m512i ones = _mm512_set1_epi8(1);
    if (type == LC_Q1_0) return _mm512_maskz_mov_epi8(_cvtu64_mask64(m[g]), ones);
    const __m512i lo = _mm512_maskz_mov_epi8(_cvtu64_mask64(m[2 * g]), ones);
    return _mm512_mask_add_epi8(lo, _cvtu64_mask64(m[2 * g + 1]), lo, _mm512_set1_epi8(2));
}
/* The 32-value sum from the integer chain c (codes . x) and the activations' minus sum ns. */
static inline __m512i LC_FN(lbx_sum)(const int type, __m512i c, __m512i ns) {
    return _mm512_add_epi32(type == LC_Q1_0 ? _mm512_slli_epi32(c, 1) : c, ns);
}

/* Activation rows x [mr] against one panel p: the 16 outputs of each row in res. */
static inline __attribute__((always_inline)) void LC_FN(x16_q1_rows)(const int type, const int mr, const uint8_t *p,
                                                                      int64_t k, const LC_FN(xsum) *x, __m512 *res) {
    const int64_t uv = LC_LBX_VALUES(type);
    __m512 f[4][2];
    for (int i = 0; i < 4; i++) f[i][0] = f[i][1] = _mm512_setzero_ps();
    for (int64_t u = 0; u < k / uv; u++) {
        const uint8_t *un = p + 288 * u;
        _mm_prefetch((const char *)un + LC_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 192, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 256, _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
        uint64_t m[32];
        memcpy(m, un + 32, 256);
        for (int s = 0; s < uv / 32; s++) {
            __m512i c[4][2];
            for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g += 2) {
                const __m512i u0 = LC_FN(lbx_codes)(type, m, 8 * s + g), u1 = LC_FN(lbx_codes)(type, m, 8 * s + g + 1);
                for (int i = 0; i < mr; i++) {
                    const int8_t *xr = x->xq + i * k + uv * u + 32 * s + 4 * g;
                    c[i][0] = _mm512_dpbusd_epi32(c[i][0], u0, LC_FN(x4)(xr));
                    c[i][1] = _mm512_dpbusd_epi32(c[i][1], u1, LC_FN(x4)(xr + 4));
                }
            }
            for (int i = 0; i < mr; i++) {
                const int64_t at = i * (k / 32) + (uv / 32) * u + s;
                const __m512i sum = LC_FN(lbx_sum)(type, _mm512_add_epi32(c[i][0], c[i][1]), _mm512_set1_epi32(x->ns32[at]));
                f[i][s & 1] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->dx32[at])), _mm512_cvtepi32_ps(sum), f[i][s & 1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = _mm512_add_ps(f[i][0], f[i][1]);
}

/* As x16_q1_rows over two panels (p, p + pb) at once, so that each broadcast of 4 activations feeds two
   vpdpbusd (steps of 5+ rows: one panel per pass ran 64 rows 0.78x as fast as the GGUF panel GEMM). */
static inline __attribute__((always_inline)) void LC_FN(x16_q1_rows2)(const int type, const int mr, const uint8_t *p, int64_t pb,
                                                                       int64_t k, const LC_FN(xsum) *x,
                                                                       __m512 res[][2]) {
    const int64_t uv = LC_LBX_VALUES(type);
    __m512 f[4][2];
    for (int i = 0; i < 4; i++) f[i][0] = f[i][1] = _mm512_setzero_ps();
    for (int64_t u = 0; u < k / uv; u++) {
        const uint8_t *un = p + 288 * u;
        __m512 d[2];
        uint64_t m[2][32];
        for (int pp = 0; pp < 2; pp++) {
            _mm_prefetch((const char *)un + pp * pb + LC_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)un + pp * pb + LC_PF + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)un + pp * pb + LC_PF + 256, _MM_HINT_T0);
            d[pp] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(un + pp * pb)));
            memcpy(m[pp], un + pp * pb + 32, 256);
        }
        for (int s = 0; s < uv / 32; s++) {
            __m512i c[4][2];
            for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                const __m512i u0 = LC_FN(lbx_codes)(type, m[0], 8 * s + g), u1 = LC_FN(lbx_codes)(type, m[1], 8 * s + g);
                for (int i = 0; i < mr; i++) {
                    const __m512i xb = LC_FN(x4)(x->xq + i * k + uv * u + 32 * s + 4 * g);
                    c[i][0] = _mm512_dpbusd_epi32(c[i][0], u0, xb);
                    c[i][1] = _mm512_dpbusd_epi32(c[i][1], u1, xb);
                }
            }
            for (int i = 0; i < mr; i++) {
                const int64_t at = i * (k / 32) + (uv / 32) * u + s;
                const __m512i ns = _mm512_set1_epi32(x->ns32[at]);
                const __m512 dx = _mm512_set1_ps(x->dx32[at]);
                for (int pp = 0; pp < 2; pp++) {
                    const __m512i sum = LC_FN(lbx_sum)(type, c[i][pp], ns);
                    f[i][pp] = _mm512_fmadd_ps(_mm512_mul_ps(d[pp], dx), _mm512_cvtepi32_ps(sum), f[i][pp]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i][0] = f[i][0], res[i][1] = f[i][1];
}

/* One pass of activation rows x [mr] (a literal after inlining) over one panel or two at p: res[i][pp]. */
static inline __attribute__((always_inline)) void LC_FN(x16_lbt_pass)(const int type, const int mr, const int two,
                                                                       const uint8_t *p, int64_t pb, int64_t k,
                                                                       const LC_FN(xsum) *x, __m512 res[][2]) {
    if (two) {
        LC_FN(x16_q1_rows2)(type, mr, p, pb, k, x, res);
    } else {
        __m512 one[4];
        LC_FN(x16_q1_rows)(type, mr, p, k, x, one);
        for (int i = 0; i < mr; i++) res[i][0] = one[i];
    }
}

/* The type and row count as literals (inside the OpenMP region, where a captured variable would not fold). */
#define LC_LBX_PASS(T)                                                                                          \
    switch (mr) {                                                                                               \
    case 1: LC_FN(x16_lbt_pass)(T, 1, two, w + p0 * pb, pb, k, &xr, res); break;                                \
    case 2: LC_FN(x16_lbt_pass)(T, 2, two, w + p0 * pb, pb, k, &xr, res); break;                                \
    case 3: LC_FN(x16_lbt_pass)(T, 3, two, w + p0 * pb, pb, k, &xr, res); break;                                \
    default: LC_FN(x16_lbt_pass)(T, 4, two, w + p0 * pb, pb, k, &xr, res); break;                               \
    }

/* out [t, n] (row stride ldo) = activations x . the n rows of Q1_0 / Q2_0 panels w (lc_x16_avx512.h's
   x16_matmul hands these types here); panels (pairs of them for steps of 5+ rows: one panel per pass ran
   64 Q1_0 rows 0.78x as fast as the GGUF panel GEMM) split over threads, activation rows 4 at a time over
   each (288 bytes a unit per panel: they stay in L1). */
static void LC_FN(x16_q1)(int type, const uint8_t *w, int64_t n, int64_t k, LC_FN(xsum) x, int64_t t, void *out,
                          int out_bf16, int64_t ldo, int nth) {
    const int64_t panels = (n + 15) / 16, pb = lc_x16_panel_bytes(type, k);
    /* Q2_0 one panel per pass: 8 / 16 / 64 rows 441 / 439 / 409 GFLOP/s against 415 / 422 / 401 in pairs */
    const int np = t >= 5 && panels > 1 && type == LC_Q1_0 ? 2 : 1;
    const int64_t items = (panels + np - 1) / np;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static)
#endif
    for (int64_t it = 0; it < items; it++) {
        const int64_t p0 = it * np;
        const int two = np == 2 && p0 + 1 < panels; /* a last odd panel runs alone */
        for (int64_t t0 = 0; t0 < t; t0 += 4) {
            const int mr = (int)(t - t0 < 4 ? t - t0 : 4);
            LC_FN(xsum) xr = {x.xq + t0 * k, x.ns16 + t0 * (k / 16), x.ns32 + t0 * (k / 32), x.dx32 + t0 * (k / 32),
                              x.fs32 + t0 * (k / 32)};
            __m512 res[4][2];
            if (type == LC_Q1_0) {
                LC_LBX_PASS(LC_Q1_0)
            } else {
                LC_LBX_PASS(LC_Q2_0)
            }
            for (int pp = 0; pp < (two ? 2 : 1); pp++) {
                const int64_t left = n - 16 * (p0 + pp);
                for (int i = 0; i < mr; i++)
                    LC_FN(x16_store)(res[i][pp], out, out_bf16, (t0 + i) * ldo + 16 * (p0 + pp), (int)(left < 16 ? left : 16));
            }
        }
    }
}
#undef LC_LBX_PASS
#undef LC_LBX_VALUES
