/* Q1_0 (lc_lowbit.h) in the x16 layout on AVX-512 VNNI (lc_x16_layout.h draws the unit: 128 values of 16
rows in 288 bytes, as in the file: d[16] (f16), then 32 64-bit masks, mask g bit 4c + b = the sign bit of
row c's value 4g + b). Each mask becomes 0/1 bytes in one masked move and feeds one vpdpbusd against 4
broadcast activations for all 16 rows; a 32-value sum of +-1 x is then 2 (bits . x) - sum(x) (the
activations' ns32), scaled by the rows' d times the activations' scale once per 32. The one-row loop
(lc_lowbit_rows.h) ran 2.2x slower in benchmarks/c/lowbit_x16_proto.c. Included by lc_x16_avx512.h before
its x16_matmul, which hands Q1_0 here; lc_x16_supported offers Q1_0's x16 form on this ISA only. */

/* Activation rows x [mr] against one panel p: the 16 outputs of each row in res. */
static inline __attribute__((always_inline)) void LC_FN(x16_q1_rows)(const int mr, const uint8_t *p, int64_t k,
                                                                      const LC_FN(xsum) *x, __m512 *res) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512 f[4][2];
    for (int i = 0; i < 4; i++) f[i][0] = f[i][1] = _mm512_setzero_ps();
    for (int64_t u = 0; u < k / 128; u++) {
        const uint8_t *un = p + 288 * u;
        _mm_prefetch((const char *)un + LC_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 192, _MM_HINT_T0);
        _mm_prefetch((const char *)un + LC_PF + 256, _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
        uint64_t m[32];
        memcpy(m, un + 32, 256);
        for (int s = 0; s < 4; s++) {
            __m512i c[4][2];
            for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g += 2) {
                const __m512i u0 = _mm512_maskz_mov_epi8(_cvtu64_mask64(m[8 * s + g]), ones);
                const __m512i u1 = _mm512_maskz_mov_epi8(_cvtu64_mask64(m[8 * s + g + 1]), ones);
                for (int i = 0; i < mr; i++) {
                    const int8_t *xr = x->xq + i * k + 128 * u + 32 * s + 4 * g;
                    c[i][0] = _mm512_dpbusd_epi32(c[i][0], u0, LC_FN(x4)(xr));
                    c[i][1] = _mm512_dpbusd_epi32(c[i][1], u1, LC_FN(x4)(xr + 4));
                }
            }
            for (int i = 0; i < mr; i++) {
                const int64_t at = i * (k / 32) + 4 * u + s;
                const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(c[i][0], c[i][1]), 1),
                                                     _mm512_set1_epi32(x->ns32[at]));
                f[i][s & 1] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->dx32[at])), _mm512_cvtepi32_ps(sum), f[i][s & 1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = _mm512_add_ps(f[i][0], f[i][1]);
}

/* As x16_q1_rows over two panels (p, p + pb) at once, so that each broadcast of 4 activations feeds two
   vpdpbusd (steps of 5+ rows: one panel per pass ran 64 rows 0.78x as fast as the GGUF panel GEMM). */
static inline __attribute__((always_inline)) void LC_FN(x16_q1_rows2)(const int mr, const uint8_t *p, int64_t pb,
                                                                       int64_t k, const LC_FN(xsum) *x,
                                                                       __m512 res[][2]) {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512 f[4][2];
    for (int i = 0; i < 4; i++) f[i][0] = f[i][1] = _mm512_setzero_ps();
    for (int64_t u = 0; u < k / 128; u++) {
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
        for (int s = 0; s < 4; s++) {
            __m512i c[4][2];
            for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                const __m512i u0 = _mm512_maskz_mov_epi8(_cvtu64_mask64(m[0][8 * s + g]), ones);
                const __m512i u1 = _mm512_maskz_mov_epi8(_cvtu64_mask64(m[1][8 * s + g]), ones);
                for (int i = 0; i < mr; i++) {
                    const __m512i xb = LC_FN(x4)(x->xq + i * k + 128 * u + 32 * s + 4 * g);
                    c[i][0] = _mm512_dpbusd_epi32(c[i][0], u0, xb);
                    c[i][1] = _mm512_dpbusd_epi32(c[i][1], u1, xb);
                }
            }
            for (int i = 0; i < mr; i++) {
                const int64_t at = i * (k / 32) + 4 * u + s;
                const __m512i ns = _mm512_set1_epi32(x->ns32[at]);
                const __m512 dx = _mm512_set1_ps(x->dx32[at]);
                for (int pp = 0; pp < 2; pp++) {
                    const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(c[i][pp], 1), ns);
                    f[i][pp] = _mm512_fmadd_ps(_mm512_mul_ps(d[pp], dx), _mm512_cvtepi32_ps(sum), f[i][pp]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i][0] = f[i][0], res[i][1] = f[i][1];
}

/* out [t, n] (row stride ldo) = activations x . the n rows of Q1_0 panels w; panels (pairs of them for
   steps of 5+ rows) split over threads, activation rows 4 at a time over each (288 bytes per 128 values a
   panel: they stay in L1). */
static void LC_FN(x16_q1)(const uint8_t *w, int64_t n, int64_t k, LC_FN(xsum) x, int64_t t, void *out, int out_bf16,
                          int64_t ldo, int nth) {
    const int64_t panels = (n + 15) / 16, pb = lc_x16_panel_bytes(LC_Q1_0, k);
    const int np = t >= 5 && panels > 1 ? 2 : 1;
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
            if (two) {
                switch (mr) { /* a literal: the chains stay in registers */
                case 1: LC_FN(x16_q1_rows2)(1, w + p0 * pb, pb, k, &xr, res); break;
                case 2: LC_FN(x16_q1_rows2)(2, w + p0 * pb, pb, k, &xr, res); break;
                case 3: LC_FN(x16_q1_rows2)(3, w + p0 * pb, pb, k, &xr, res); break;
                default: LC_FN(x16_q1_rows2)(4, w + p0 * pb, pb, k, &xr, res); break;
                }
            } else {
                __m512 one[4];
                switch (mr) {
                case 1: LC_FN(x16_q1_rows)(1, w + p0 * pb, k, &xr, one); break;
                case 2: LC_FN(x16_q1_rows)(2, w + p0 * pb, k, &xr, one); break;
                case 3: LC_FN(x16_q1_rows)(3, w + p0 * pb, k, &xr, one); break;
                default: LC_FN(x16_q1_rows)(4, w + p0 * pb, k, &xr, one); break;
                }
                for (int i = 0; i < mr; i++) res[i][0] = one[i];
            }
            for (int pp = 0; pp < (two ? 2 : 1); pp++) {
                const int64_t left = n - 16 * (p0 + pp);
                for (int i = 0; i < mr; i++)
                    LC_FN(x16_store)(res[i][pp], out, out_bf16, (t0 + i) * ldo + 16 * (p0 + pp), (int)(left < 16 ? left : 16));
            }
        }
    }
}
