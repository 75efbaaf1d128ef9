/* Matmul on x16 panels (lc_x16_layout.h) with AVX-512 VNNI, for every row count: each 64-byte load of
codes feeds one vpdpbusd per activation row (4 broadcast activation bytes against 4 codes of 16 weight
rows), so a panel's 16 outputs accumulate in one register per activation row. Integer sums become float
once per unit of one scale (32 values; 16 for Q6_K). Two integer chains per row (even and odd code
groups) keep vpdpbusd's latency hidden when only one row runs. Included by lc_impl.h. */

#define LC_X16_MR 6 /* activation rows per pass over a panel: 2 chains + 1 result register each */

/* Per-call activation summaries the x16 kernels read beside the codes (from lc_quantize's outputs). */
typedef struct {
    const int8_t *xq;    /* [t, k] codes */
    const int32_t *ns16; /* [t, k / 16] minus each 16 values' code sum */
    const int32_t *ns32; /* [t, k / 32] minus each 32 values' code sum */
    const float *dx32;   /* [t, k / 32] activation scale */
    const float *fs32;   /* [t, k / 32] scale * code sum */
} LC_FN(xsum);

static inline __m512i LC_FN(x4)(const int8_t *x) { /* 4 activation bytes in every dword */
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

/* 16 unsigned or signed bytes as floats. */
static inline __m512 LC_FN(u8f)(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline __m512 LC_FN(i8f)(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline __m512 LC_FN(h16)(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* 32 values of nibble codes (q) into the two chains of `mr` rows starting at activation column x0. */
static inline __attribute__((always_inline)) void LC_FN(x16_nibbles)(const int mr, const uint8_t *q, const int8_t *xq,
                                                                     int64_t k, int64_t x0, __m512i *a, __m512i *b) {
    const __m512i low = _mm512_set1_epi8(15);
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
        __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int i = 0; i < mr; i++) {
            a[i] = _mm512_dpbusd_epi32(a[i], lo, LC_FN(x4)(xq + i * k + x0 + 8 * j));
            b[i] = _mm512_dpbusd_epi32(b[i], hi, LC_FN(x4)(xq + i * k + x0 + 8 * j + 4));
        }
    }
}

/* out[i] += the panel `p` against activation rows 0..mr of `x` (pointers already at the first row). */
static inline __attribute__((always_inline)) void LC_FN(x16_panel)(const int type, const int mr, const uint8_t *p,
                                                                   int64_t k, LC_FN(xsum) x, __m512 *out) {
    const int64_t k16 = k / 16, k32 = k / 32, ub = lc_x16_unit_bytes(type);
    __m512i a[LC_X16_MR], b[LC_X16_MR];
    if (type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q8_0) {
        for (int64_t s = 0; s < k32; s++) {
            const uint8_t *u = p + s * ub;
            _mm_prefetch((const char *)(u + LC_PF), _MM_HINT_T0);
            _mm_prefetch((const char *)(u + LC_PF + 64), _MM_HINT_T0);
            _mm_prefetch((const char *)(u + LC_PF + 128), _MM_HINT_T0);
            _mm_prefetch((const char *)(u + LC_PF + 192), _MM_HINT_T0);
            _mm_prefetch((const char *)(u + LC_PF + 256), _MM_HINT_T0);
            if (type == LC_Q8_0) {
                for (int l = 320; l < 16 * 34; l += 64) _mm_prefetch((const char *)(u + LC_PF + l), _MM_HINT_T0);
            }
            __m512 dv = LC_FN(h16)(u);
            for (int i = 0; i < mr; i++) {
                b[i] = _mm512_setzero_si512();
                /* offsets -8d (Q4_0), -128d (Q8_0): start at that times the activation sum */
                a[i] = type == LC_Q4_1 ? b[i] : _mm512_slli_epi32(_mm512_set1_epi32(x.ns32[i * k32 + s]), type == LC_Q4_0 ? 3 : 7);
            }
            if (type == LC_Q8_0) {
                for (int g = 0; g < 8; g += 2) {
                    __m512i c0 = _mm512_loadu_si512((const void *)(u + 32 + 64 * g));
                    __m512i c1 = _mm512_loadu_si512((const void *)(u + 96 + 64 * g));
                    for (int i = 0; i < mr; i++) {
                        a[i] = _mm512_dpbusd_epi32(a[i], c0, LC_FN(x4)(x.xq + i * k + 32 * s + 4 * g));
                        b[i] = _mm512_dpbusd_epi32(b[i], c1, LC_FN(x4)(x.xq + i * k + 32 * s + 4 * g + 4));
                    }
                }
            } else {
                LC_FN(x16_nibbles)(mr, u + (type == LC_Q4_1 ? 64 : 32), x.xq, k, 32 * s, a, b);
            }
            for (int i = 0; i < mr; i++) {
                __m512 f = _mm512_mul_ps(dv, _mm512_set1_ps(x.dx32[i * k32 + s]));
                out[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a[i], b[i])), f, out[i]);
            }
            if (type == LC_Q4_1) {
                __m512 mv = LC_FN(h16)(u + 32);
                for (int i = 0; i < mr; i++) out[i] = _mm512_fmadd_ps(mv, _mm512_set1_ps(x.fs32[i * k32 + s]), out[i]);
            }
        }
        return;
    }
    for (int64_t s8 = 0; s8 < k / 256; s8++) { /* K-quants: one 256-value unit per round */
        const uint8_t *u = p + s8 * ub;
        __m512 dv = LC_FN(h16)(u);
        if (type == LC_Q4_K) {
            __m512 mn = LC_FN(h16)(u + 32);
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = u + 320 + 256 * j;
                for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(q + LC_PF + l), _MM_HINT_T0);
                int64_t s = 8 * s8 + j;
                for (int i = 0; i < mr; i++) a[i] = b[i] = _mm512_setzero_si512();
                LC_FN(x16_nibbles)(mr, q, x.xq, k, 32 * s, a, b);
                __m512 sv = _mm512_mul_ps(dv, LC_FN(u8f)(u + 64 + 16 * j));
                __m512 mv = _mm512_mul_ps(mn, LC_FN(u8f)(u + 192 + 16 * j)); /* subtracted */
                for (int i = 0; i < mr; i++) {
                    __m512 f = _mm512_mul_ps(sv, _mm512_set1_ps(x.dx32[i * k32 + s]));
                    out[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a[i], b[i])), f, out[i]);
                    out[i] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(x.fs32[i * k32 + s]), out[i]);
                }
            }
        } else { /* LC_Q6_K: one scale per 16 values */
            const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
            for (int j = 0; j < 8; j++) {
                const uint8_t *ql = u + 288 + 256 * j, *qh = u + 288 + 2048 + 128 * j;
                for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(ql + LC_PF + l), _MM_HINT_T0);
                _mm_prefetch((const char *)(qh + LC_PF), _MM_HINT_T0);
                _mm_prefetch((const char *)(qh + LC_PF + 64), _MM_HINT_T0);
                int64_t s = 8 * s8 + j;
                for (int hh = 0; hh < 2; hh++) {
                    int64_t h = 2 * s + hh, x0 = 32 * s + 16 * hh;
                    __m512i v0 = _mm512_loadu_si512((const void *)(ql + 128 * hh));
                    __m512i v1 = _mm512_loadu_si512((const void *)(ql + 128 * hh + 64));
                    __m512i hv = _mm512_loadu_si512((const void *)(qh + 64 * hh));
                    __m512i c0 = _mm512_or_si512(_mm512_and_si512(v0, low), _mm512_and_si512(_mm512_slli_epi16(hv, 4), top));
                    __m512i c1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low),
                                                 _mm512_and_si512(_mm512_slli_epi16(hv, 2), top));
                    __m512i c2 = _mm512_or_si512(_mm512_and_si512(v1, low), _mm512_and_si512(hv, top));
                    __m512i c3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low),
                                                 _mm512_and_si512(_mm512_srli_epi16(hv, 2), top));
                    for (int i = 0; i < mr; i++) { /* offset -32 x scale: start at -32 x the activation sum */
                        a[i] = _mm512_slli_epi32(_mm512_set1_epi32(x.ns16[i * k16 + h]), 5);
                        const int8_t *xr = x.xq + i * k + x0;
                        a[i] = _mm512_dpbusd_epi32(a[i], c0, LC_FN(x4)(xr));
                        b[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c1, LC_FN(x4)(xr + 4));
                        a[i] = _mm512_dpbusd_epi32(a[i], c2, LC_FN(x4)(xr + 8));
                        b[i] = _mm512_dpbusd_epi32(b[i], c3, LC_FN(x4)(xr + 12));
                    }
                    __m512 sv = _mm512_mul_ps(dv, LC_FN(i8f)(u + 32 + 16 * (2 * j + hh)));
                    for (int i = 0; i < mr; i++) {
                        __m512 f = _mm512_mul_ps(sv, _mm512_set1_ps(x.dx32[i * k32 + s]));
                        out[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a[i], b[i])), f, out[i]);
                    }
                }
            }
        }
    }
}

/* 16 floats (the first `cols`) to out + at, as float32 or bfloat16 (nearest even; inf/NaN kept). */
static inline void LC_FN(x16_store)(__m512 v, void *out, int out_bf16, int64_t at, int cols) {
    __mmask16 m = (__mmask16)(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
    if (!out_bf16) {
        _mm512_mask_storeu_ps((float *)out + at, m, v);
        return;
    }
    __m512i bits = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7F800000)),
                                                _mm512_set1_epi32(0x7F800000));
    rounded = _mm512_mask_mov_epi32(rounded, special, bits);
    _mm256_mask_storeu_epi16((uint16_t *)out + at, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

#define LC_X16_ROWS(T)                                                                                     \
    switch (mr) {                                                                                          \
    case 1: LC_FN(x16_panel)(T, 1, p, k, xr, acc); break;                                                  \
    case 2: LC_FN(x16_panel)(T, 2, p, k, xr, acc); break;                                                  \
    case 3: LC_FN(x16_panel)(T, 3, p, k, xr, acc); break;                                                  \
    case 4: LC_FN(x16_panel)(T, 4, p, k, xr, acc); break;                                                  \
    case 5: LC_FN(x16_panel)(T, 5, p, k, xr, acc); break;                                                  \
    default: LC_FN(x16_panel)(T, 6, p, k, xr, acc); break;                                                 \
    }

/* out[t, n] (row stride ldo) for the packed matrix w of n rows: panels split over threads, each panel
   read once per LC_X16_MR activation rows (from L1/L2 after the first pass). */
static void LC_FN(x16_matmul)(int type, const uint8_t *w, int64_t n, int64_t k, LC_FN(xsum) x, int64_t t, void *out,
                              int out_bf16, int64_t ldo, int nth) {
    int64_t panels = (n + 15) / 16, pb = lc_x16_panel_bytes(type, k);
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static)
#endif
    for (int64_t pi = 0; pi < panels; pi++) {
        const uint8_t *p = w + pi * pb;
        int cols = (int)(n - 16 * pi < 16 ? n - 16 * pi : 16);
        for (int64_t t0 = 0; t0 < t; t0 += LC_X16_MR) {
            int mr = (int)(t - t0 < LC_X16_MR ? t - t0 : LC_X16_MR);
            LC_FN(xsum) xr = {x.xq + t0 * k, x.ns16 + t0 * (k / 16), x.ns32 + t0 * (k / 32), x.dx32 + t0 * (k / 32),
                              x.fs32 + t0 * (k / 32)};
            __m512 acc[LC_X16_MR];
            for (int i = 0; i < LC_X16_MR; i++) acc[i] = _mm512_setzero_ps();
            switch (type) {
            case LC_Q4_0: LC_X16_ROWS(LC_Q4_0) break;
            case LC_Q4_1: LC_X16_ROWS(LC_Q4_1) break;
            case LC_Q8_0: LC_X16_ROWS(LC_Q8_0) break;
            case LC_Q4_K: LC_X16_ROWS(LC_Q4_K) break;
            default: LC_X16_ROWS(LC_Q6_K) break;
            }
            for (int i = 0; i < mr; i++) LC_FN(x16_store)(acc[i], out, out_bf16, (t0 + i) * ldo + 16 * pi, cols);
        }
    }
}
#undef LC_X16_ROWS
