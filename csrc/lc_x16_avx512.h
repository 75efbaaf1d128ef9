/* Matmul on x16 panels (lc_x16_layout.h) with AVX-512 VNNI, for every row count: each 64-byte load of
codes feeds one vpdpbusd per activation row (4 broadcast activation bytes against 4 codes of 16 weight
rows), so a panel's 16 outputs accumulate in one register per activation row. Integer sums become float
once per unit of one scale (32 values; 16 for Q6_K). Steps of 1-2 rows read one panel per pass with two
integer chains per row (even and odd code groups: vpdpbusd's latency stays hidden); more rows read two
panels per pass, so each broadcast feeds two vpdpbusd. Included by lc_kernels.c for the AVX-512 variant. */

/* Prefetch distance in bytes: the panels stream from memory once. 8 KiB, not 4: one-row decode of the real
   Qwen2.5-Coder-1.5B Q4_K_M (~1 GB a token, panels in 2 MiB pages) ran 1.05-1.08x faster (engine, alternated
   builds), its Q4_K MLP matrices 1.17-1.25x and the Q6_K head 1.09x on two threads; 12 and 16 KiB read the
   Q4_K matrices faster still but the Q6_K head slower (1.01x and 0.99x of the engine at 4 KiB). */
#ifndef LC_PF
#define LC_PF 8192
#endif
#define LC_X16_MR 6        /* activation rows per pass over a panel (pair) */
#define LC_X16_ONE_PANEL 2 /* steps of up to this many rows read one panel per pass */
#ifndef LC_X16_EXPAND_ROWS /* steps of this many rows expand lc_x16_expands' codes once per panel (pair) */
#define LC_X16_EXPAND_ROWS 12
#endif

/* Per-call activation summaries the x16 kernels read beside the codes (from lc_quantize's outputs). */
typedef lc_x16_sums LC_FN(xsum);

static inline __m512i LC_FN(x4)(const int8_t *x) { /* 4 activation bytes in every dword */
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

/* 16 unsigned or signed bytes as floats. */
static inline __m512 LC_FN(u8f)(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline __m512 LC_FN(i8f)(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline __m512 LC_FN(h16)(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* 16 floats rounded to bfloat16 (nearest even, inf/NaN kept), as lc_to_bf16, in the low half of each lane. */
static inline __m512i LC_FN(bf16_bits16)(__m512 v) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7F800000)),
                                                _mm512_set1_epi32(0x7F800000));
    return _mm512_srli_epi32(_mm512_mask_mov_epi32(rounded, special, bits), 16);
}

/* 16 floats (the first `cols`) to out + at, as float32 or bfloat16 (nearest even; inf/NaN kept). */
static inline void LC_FN(x16_store)(__m512 v, void *out, int out_bf16, int64_t at, int cols) {
    __mmask16 m = (__mmask16)(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
    if (!out_bf16) {
        _mm512_mask_storeu_ps((float *)out + at, m, v);
        return;
    }
    _mm256_mask_storeu_epi16((uint16_t *)out + at, m, _mm512_cvtepi32_epi16(LC_FN(bf16_bits16)(v)));
}

/* Integer chains: with one panel, two per row (even and odd code groups: vpdpbusd's latency stays hidden
   at one row); with two panels, one per row and panel. ch(np, g, pp) picks the chain of code group g. */
#define LC_X16_CH(np, g, pp) ((np) == 1 ? ((g) & 1) : (pp))

/* Code group g (4 values at activation column x0 + 4g) of every panel into the chains of `mr` rows. */
static inline __attribute__((always_inline)) void LC_FN(x16_group)(const int mr, const int np, const int g, const __m512i *cv,
                                                                   const int8_t *xq, int64_t k, int64_t x0,
                                                                   __m512i c[][2]) {
    for (int i = 0; i < mr; i++) {
        __m512i xb = LC_FN(x4)(xq + i * k + x0 + 4 * g);
        for (int pp = 0; pp < np; pp++) c[i][LC_X16_CH(np, g, pp)] = _mm512_dpbusd_epi32(c[i][LC_X16_CH(np, g, pp)], cv[pp], xb);
    }
}

/* Chunk j (0..3) of 32 values of 5-bit codes: nibble codes v and their fifth bits fv (bit g of each byte:
   code group g) as the codes of groups 2j (lo) and 2j + 1 (hi): a byte mask of each group's bit, then
   + 16 under it. */
static inline __attribute__((always_inline)) void LC_FN(x16_fives)(__m512i v, __m512i fv, int j, __m512i *lo, __m512i *hi) {
    const __m512i low = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    __m512i l = _mm512_and_si512(v, low), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    *lo = _mm512_mask_add_epi8(l, _mm512_test_epi8_mask(fv, _mm512_set1_epi8((char)(1 << (2 * j)))), l, sixteen);
    *hi = _mm512_mask_add_epi8(h, _mm512_test_epi8_mask(fv, _mm512_set1_epi8((char)(2 << (2 * j)))), h, sixteen);
}

/* Half of 32 Q6_K values (16): low nibbles v0, v1 and the high-bit chunk hv as 4 code groups. */
static inline __attribute__((always_inline)) void LC_FN(x16_sixes)(__m512i v0, __m512i v1, __m512i hv, __m512i *cg) {
    const __m512i low = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
    cg[0] = _mm512_or_si512(_mm512_and_si512(v0, low), _mm512_and_si512(_mm512_slli_epi16(hv, 4), top));
    cg[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low), _mm512_and_si512(_mm512_slli_epi16(hv, 2), top));
    cg[2] = _mm512_or_si512(_mm512_and_si512(v1, low), _mm512_and_si512(hv, top));
    cg[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low), _mm512_and_si512(_mm512_srli_epi16(hv, 2), top));
}

/* Half hh of 32 Q3_K values (16): their low 2-bit chunk lv and the third bits fv (bit g: code group g of
   the 32) as 4 code groups of 0..7. Shifts within 16-bit lanes keep each bit in its byte. */
static inline __attribute__((always_inline)) void LC_FN(x16_threes)(__m512i lv, __m512i fv, const int hh, __m512i *cg) {
    const __m512i two = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    for (int m = 0; m < 4; m++) {
        const int g = 4 * hh + m; /* bit g of fv to bit 2 */
        __m512i f = g <= 2 ? _mm512_slli_epi16(fv, 2 - g) : _mm512_srli_epi16(fv, g - 2);
        cg[m] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lv, 2 * m), two), _mm512_and_si512(f, four));
    }
}

/* 32 values of nibble codes (at q in each panel, panels pb apart) into the chains; with `fifth` (Q5_0/1/K)
   the codes' fifth bits from that chunk are added as 16 (x16_fives). */
static inline __attribute__((always_inline)) void LC_FN(x16_nibbles)(const int mr, const int np, const uint8_t *q, int64_t pb,
                                                                     const uint8_t *fifth, const int8_t *xq, int64_t k,
                                                                     int64_t x0, __m512i c[][2]) {
    const __m512i low = _mm512_set1_epi8(15), high = _mm512_set1_epi8((char)0xF0);
    __m512i fv[2];
    if (fifth)
        for (int pp = 0; pp < np; pp++) fv[pp] = _mm512_loadu_si512((const void *)(fifth + pp * pb));
    for (int j = 0; j < 4; j++) {
        __m512i lo[2], hi[2];
        for (int pp = 0; pp < np; pp++) {
            __m512i v = _mm512_loadu_si512((const void *)(q + pp * pb + 64 * j));
            if (fifth) {
                LC_FN(x16_fives)(v, fv[pp], j, &lo[pp], &hi[pp]);
            } else { /* one panel: high nibbles stay in place (16 x the code) in chain 1, shifted once per unit */
                lo[pp] = _mm512_and_si512(v, low);
                hi[pp] = np == 1 ? _mm512_and_si512(v, high) : _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
        }
        LC_FN(x16_group)(mr, np, 2 * j, lo, xq, k, x0, c);
        LC_FN(x16_group)(mr, np, 2 * j + 1, hi, xq, k, x0, c);
    }
}

/* Chains of each row and panel to zero, or to `init` (an offset times the activation sum) for chain 0
   of each panel. */
static inline __attribute__((always_inline)) void LC_FN(x16_start)(const int mr, const int np, const int shift, const int32_t *ns,
                                                                   int64_t stride, __m512i c[][2]) {
    for (int i = 0; i < mr; i++) {
        c[i][0] = c[i][1] = _mm512_setzero_si512();
        if (shift >= 0) {
            __m512i init = _mm512_slli_epi32(_mm512_set1_epi32(ns[i * stride]), shift);
            for (int pp = 0; pp < np; pp++) c[i][LC_X16_CH(np, 0, pp)] = init;
        }
    }
}

/* out[i][pp] += chains as float times scale sv[pp] times the row's activation scale; with `nib16` (one
   panel of nibble codes) chain 1 holds 16 x its sums (x16_nibbles). */
static inline __attribute__((always_inline)) void LC_FN(x16_scale)(const int mr, const int np, const int nib16, __m512i c[][2],
                                                                   const __m512 *sv, const float *dx, int64_t stride,
                                                                   __m512 out[][2]) {
    for (int i = 0; i < mr; i++) {
        __m512 d = _mm512_set1_ps(dx[i * stride]);
        if (np == 1) {
            __m512i odd = nib16 ? _mm512_srai_epi32(c[i][1], 4) : c[i][1];
            out[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c[i][0], odd)), _mm512_mul_ps(sv[0], d), out[i][0]);
        } else {
            for (int pp = 0; pp < np; pp++)
                out[i][pp] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i][pp]), _mm512_mul_ps(sv[pp], d), out[i][pp]);
        }
    }
}

/* Code groups 0..groups of the values from x0 on, from codes expanded to bytes (x16_expand: group g of
   values x0.. at xc + 16 x0 + 64 g, the second panel 16 k bytes on), into the chains. */
static inline __attribute__((always_inline)) void LC_FN(x16_expanded)(const int mr, const int np, const int groups, const uint8_t *xc,
                                                                      const int8_t *xq, int64_t k, int64_t x0, __m512i c[][2]) {
    for (int g = 0; g < groups; g++) {
        __m512i cv[2];
        for (int pp = 0; pp < np; pp++) cv[pp] = _mm512_loadu_si512((const void *)(xc + pp * 16 * k + 16 * x0 + 64 * g));
        LC_FN(x16_group)(mr, np, g, cv, xq, k, x0, c);
    }
}

/* The np panels from p (pb bytes apart) with codes as x16_panel reads them, written to xc as bytes: value
   v's group (v / 4) of 16 columns at xc + 16 v, the second panel 16 k bytes on. */
static void LC_FN(x16_expand)(int type, int np, const uint8_t *p, int64_t pb, int64_t k, uint8_t *xc) {
    const int64_t ub = lc_x16_unit_bytes(type);
    for (int pp = 0; pp < np; pp++, p += pb, xc += 16 * k) {
        for (int64_t s = 0; s < k / 32; s++) { /* 32 values: 8 groups of 64 bytes */
            const uint8_t *u = p + (type >= LC_Q2_K ? (s / 8) * ub : s * ub);
            int j8 = (int)(s % 8);
            if (type != LC_Q3_K && type != LC_Q6_K) { /* Q5_0, Q5_1, Q5_K */
                const uint8_t *q = type == LC_Q5_K ? u + LC_X16_Q5_QL(j8) : u + LC_X16_LEGACY_Q(type);
                __m512i fv = _mm512_loadu_si512((const void *)(type == LC_Q5_K ? u + LC_X16_Q5_QH(j8) : q + 256)), lo, hi;
                for (int j = 0; j < 4; j++) {
                    LC_FN(x16_fives)(_mm512_loadu_si512((const void *)(q + 64 * j)), fv, j, &lo, &hi);
                    _mm512_storeu_si512((void *)(xc + 512 * s + 128 * j), lo);
                    _mm512_storeu_si512((void *)(xc + 512 * s + 128 * j + 64), hi);
                }
            } else if (type == LC_Q3_K) {
                const uint8_t *ql = u + LC_X16_Q3_QL(j8);
                __m512i fv = _mm512_loadu_si512((const void *)(u + LC_X16_Q3_QH(j8))), cg[4];
                for (int hh = 0; hh < 2; hh++) {
                    LC_FN(x16_threes)(_mm512_loadu_si512((const void *)(ql + 64 * hh)), fv, hh, cg);
                    for (int g = 0; g < 4; g++) _mm512_storeu_si512((void *)(xc + 512 * s + 256 * hh + 64 * g), cg[g]);
                }
            } else { /* LC_Q6_K */
                const uint8_t *ql = u + LC_X16_Q6_QL(j8), *qh = u + LC_X16_Q6_QH(j8);
                for (int hh = 0; hh < 2; hh++) {
                    __m512i cg[4];
                    LC_FN(x16_sixes)(_mm512_loadu_si512((const void *)(ql + 128 * hh)),
                                     _mm512_loadu_si512((const void *)(ql + 128 * hh + 64)),
                                     _mm512_loadu_si512((const void *)(qh + 64 * hh)), cg);
                    for (int g = 0; g < 4; g++) _mm512_storeu_si512((void *)(xc + 512 * s + 256 * hh + 64 * g), cg[g]);
                }
            }
        }
    }
}

/* The np panels from `p` (pb bytes apart) against activation rows 0..mr of `x`, stored to dst (row
   stride ldo; the first cols[pp] columns of each panel); with xc, their codes from there (x16_expand).
   Accumulators are locals of literal-size loops after inlining, so they stay in registers (an array the
   caller indexed lived on the stack). */
static inline __attribute__((always_inline)) void LC_FN(x16_panel)(const int type, const int mr, const int np, const uint8_t *p,
                                                                   int64_t pb, int64_t k, LC_FN(xsum) x, const uint8_t *xc,
                                                                   void *dst, int out_bf16, int64_t ldo, const int *cols) {
    const int64_t k16 = k / 16, k32 = k / 32, ub = lc_x16_unit_bytes(type);
    __m512i c[LC_X16_MR][2];
    __m512 sv[2], mv[2], out[LC_X16_MR][2];
    for (int i = 0; i < mr; i++) out[i][0] = out[i][1] = _mm512_setzero_ps();
    if (type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q5_0 || type == LC_Q5_1 || type == LC_Q8_0) {
        const int five = type == LC_Q5_0 || type == LC_Q5_1, with_min = type == LC_Q4_1 || type == LC_Q5_1;
        for (int64_t s = 0; s < k32; s++) {
            const uint8_t *u = p + s * ub;
            for (int pp = 0; pp < np && !xc; pp++)
                for (int l = 0; l < ub; l += 64) _mm_prefetch((const char *)(u + pp * pb + LC_PF + l), _MM_HINT_T0);
            for (int pp = 0; pp < np; pp++) sv[pp] = LC_FN(h16)(u + pp * pb);
            /* offsets -8d (Q4_0), -16d (Q5_0), -128d (Q8_0): chains start at that times the activation sum */
            LC_FN(x16_start)(mr, np, with_min ? -1 : type == LC_Q4_0 ? 3 : type == LC_Q5_0 ? 4 : 7, x.ns32 + s, k32, c);
            if (type == LC_Q8_0) {
                for (int g = 0; g < 8; g++) {
                    __m512i cv[2];
                    for (int pp = 0; pp < np; pp++) cv[pp] = _mm512_loadu_si512((const void *)(u + pp * pb + 32 + 64 * g));
                    LC_FN(x16_group)(mr, np, g, cv, x.xq, k, 32 * s, c);
                }
            } else if (xc) {
                LC_FN(x16_expanded)(mr, np, 8, xc, x.xq, k, 32 * s, c);
            } else {
                const uint8_t *q = u + LC_X16_LEGACY_Q(type);
                LC_FN(x16_nibbles)(mr, np, q, pb, five ? q + 256 : NULL, x.xq, k, 32 * s, c);
            }
            LC_FN(x16_scale)(mr, np, type != LC_Q8_0 && !five, c, sv, x.dx32 + s, k32, out);
            if (with_min) {
                for (int pp = 0; pp < np; pp++) mv[pp] = LC_FN(h16)(u + pp * pb + 32);
                for (int i = 0; i < mr; i++) {
                    __m512 f = _mm512_set1_ps(x.fs32[i * k32 + s]);
                    for (int pp = 0; pp < np; pp++) out[i][pp] = _mm512_fmadd_ps(mv[pp], f, out[i][pp]);
                }
            }
        }
    }
    const int64_t units256 = type >= LC_Q2_K ? k / 256 : 0;
    for (int64_t s8 = 0; s8 < units256; s8++) { /* K-quants: one 256-value unit per round */
        const uint8_t *u = p + s8 * ub;
        __m512 dv[2], mn[2];
        for (int pp = 0; pp < np; pp++) dv[pp] = LC_FN(h16)(u + pp * pb);
        if (type == LC_Q4_K || type == LC_Q5_K) {
            const int q5 = type == LC_Q5_K, chunk = q5 ? 320 : 256; /* bytes per 32 values: LC_X16_Q5_QL's stride */
            for (int pp = 0; pp < np; pp++) mn[pp] = LC_FN(h16)(u + pp * pb + 32);
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = u + 320 + chunk * j;
                for (int pp = 0; pp < np && !xc; pp++)
                    for (int l = 0; l < chunk; l += 64) _mm_prefetch((const char *)(q + pp * pb + LC_PF + l), _MM_HINT_T0);
                int64_t s = 8 * s8 + j;
                LC_FN(x16_start)(mr, np, -1, x.ns32, k32, c);
                if (xc) LC_FN(x16_expanded)(mr, np, 8, xc, x.xq, k, 32 * s, c);
                else LC_FN(x16_nibbles)(mr, np, q, pb, q5 ? u + LC_X16_Q5_QH(j) : NULL, x.xq, k, 32 * s, c);
                for (int pp = 0; pp < np; pp++) {
                    sv[pp] = _mm512_mul_ps(dv[pp], LC_FN(u8f)(u + pp * pb + 64 + 16 * j));
                    mv[pp] = _mm512_mul_ps(mn[pp], LC_FN(u8f)(u + pp * pb + 192 + 16 * j)); /* subtracted */
                }
                LC_FN(x16_scale)(mr, np, !q5 && !xc, c, sv, x.dx32 + s, k32, out);
                for (int i = 0; i < mr; i++) {
                    __m512 f = _mm512_set1_ps(x.fs32[i * k32 + s]);
                    for (int pp = 0; pp < np; pp++) out[i][pp] = _mm512_fnmadd_ps(mv[pp], f, out[i][pp]);
                }
            }
        } else if (type == LC_Q2_K) { /* a scale and a min per 16 values: d sc sum(q x) - dmin m sum(x) */
            for (int pp = 0; pp < np; pp++) mn[pp] = LC_FN(h16)(u + pp * pb + 32);
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = u + LC_X16_Q2_Q(j);
                for (int pp = 0; pp < np; pp++) /* the scale | min rows and the codes: 160 bytes */
                    for (int l = 0; l < 192; l += 64) _mm_prefetch((const char *)(q - 32 + pp * pb + LC_PF + l), _MM_HINT_T0);
                int64_t s = 8 * s8 + j;
                for (int hh = 0; hh < 2; hh++) {
                    int64_t h = 2 * s + hh;
                    LC_FN(x16_start)(mr, np, -1, x.ns16, k16, c);
                    for (int g = 0; g < 4; g++) {
                        __m512i cv[2];
                        for (int pp = 0; pp < np; pp++)
                            cv[pp] = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(q + pp * pb + 64 * hh)), 2 * g),
                                                      _mm512_set1_epi8(3));
                        LC_FN(x16_group)(mr, np, g, cv, x.xq, k, 32 * s + 16 * hh, c);
                    }
                    for (int pp = 0; pp < np; pp++) {
                        __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(u + pp * pb + LC_X16_Q2_SM(j) + 16 * hh)));
                        sv[pp] = _mm512_mul_ps(dv[pp], _mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(15))));
                        mv[pp] = _mm512_mul_ps(mn[pp], _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4)));
                    }
                    LC_FN(x16_scale)(mr, np, 0, c, sv, x.dx32 + s, k32, out);
                    for (int i = 0; i < mr; i++) { /* ns16 is minus the code sum: the min term added */
                        __m512 f = _mm512_set1_ps((float)x.ns16[i * k16 + h] * x.dx32[i * k32 + s]);
                        for (int pp = 0; pp < np; pp++) out[i][pp] = _mm512_fmadd_ps(mv[pp], f, out[i][pp]);
                    }
                }
            }
        } else { /* LC_Q3_K, LC_Q6_K: one scale per 16 values, offsets -4 and -32 x scale */
            const int q3 = type == LC_Q3_K;
            for (int j = 0; j < 8; j++) {
                const uint8_t *ql = u + (q3 ? LC_X16_Q3_QL(j) : LC_X16_Q6_QL(j)), *qh = u + (q3 ? LC_X16_Q3_QH(j) : LC_X16_Q6_QH(j));
                for (int pp = 0; pp < np && !xc; pp++) /* Q6_K: 256 + 128 bytes of codes, Q3_K: 128 + 64 */
                    for (int l = 0; l < (q3 ? 192 : 384); l += 64) _mm_prefetch((const char *)(ql + pp * pb + LC_PF + l), _MM_HINT_T0);
                int64_t s = 8 * s8 + j;
                for (int hh = 0; hh < 2; hh++) {
                    int64_t h = 2 * s + hh, x0 = 32 * s + 16 * hh;
                    /* chains start at the offset times the activation sum */
                    LC_FN(x16_start)(mr, np, q3 ? 2 : 5, x.ns16 + h, k16, c);
                    if (xc) {
                        LC_FN(x16_expanded)(mr, np, 4, xc, x.xq, k, x0, c);
                    } else {
                        __m512i cg[2][4];
                        for (int pp = 0; pp < np; pp++) {
                            if (q3)
                                LC_FN(x16_threes)(_mm512_loadu_si512((const void *)(ql + pp * pb + 64 * hh)),
                                                  _mm512_loadu_si512((const void *)(qh + pp * pb)), hh, cg[pp]);
                            else
                                LC_FN(x16_sixes)(_mm512_loadu_si512((const void *)(ql + pp * pb + 128 * hh)),
                                                 _mm512_loadu_si512((const void *)(ql + pp * pb + 128 * hh + 64)),
                                                 _mm512_loadu_si512((const void *)(qh + pp * pb + 64 * hh)), cg[pp]);
                        }
                        for (int g = 0; g < 4; g++) {
                            __m512i cv[2] = {cg[0][g], cg[1][g]};
                            LC_FN(x16_group)(mr, np, g, cv, x.xq, k, x0, c);
                        }
                    }
                    const uint8_t *sc = u + (q3 ? LC_X16_Q3_SC(j) : LC_X16_Q6_SC(j)) + 16 * hh;
                    for (int pp = 0; pp < np; pp++) sv[pp] = _mm512_mul_ps(dv[pp], LC_FN(i8f)(sc + pp * pb));
                    LC_FN(x16_scale)(mr, np, 0, c, sv, x.dx32 + s, k32, out);
                }
            }
        }
    }
    for (int pp = 0; pp < np; pp++)
        for (int i = 0; i < mr; i++) LC_FN(x16_store)(out[i][pp], dst, out_bf16, i * ldo + 16 * pp, cols[pp]);
}

#define LC_X16_ROWS(T, NP)                                                                                 \
    switch (mr) {                                                                                          \
    case 1: LC_FN(x16_panel)(T, 1, NP, p, pb, k, xr, xc, dst, out_bf16, ldo, cols); break;                                          \
    case 2: LC_FN(x16_panel)(T, 2, NP, p, pb, k, xr, xc, dst, out_bf16, ldo, cols); break;                                          \
    case 3: LC_FN(x16_panel)(T, 3, NP, p, pb, k, xr, xc, dst, out_bf16, ldo, cols); break;                                          \
    case 4: LC_FN(x16_panel)(T, 4, NP, p, pb, k, xr, xc, dst, out_bf16, ldo, cols); break;                                          \
    case 5: LC_FN(x16_panel)(T, 5, NP, p, pb, k, xr, xc, dst, out_bf16, ldo, cols); break;                                          \
    default: LC_FN(x16_panel)(T, 6, NP, p, pb, k, xr, xc, dst, out_bf16, ldo, cols); break;                                         \
    }
#define LC_X16_TYPES(NP)                                                                                   \
    switch (type) {                                                                                        \
    case LC_Q4_0: LC_X16_ROWS(LC_Q4_0, NP) break;                                                          \
    case LC_Q4_1: LC_X16_ROWS(LC_Q4_1, NP) break;                                                          \
    case LC_Q5_0: LC_X16_ROWS(LC_Q5_0, NP) break;                                                          \
    case LC_Q5_1: LC_X16_ROWS(LC_Q5_1, NP) break;                                                          \
    case LC_Q8_0: LC_X16_ROWS(LC_Q8_0, NP) break;                                                          \
    case LC_Q2_K: LC_X16_ROWS(LC_Q2_K, NP) break;                                                          \
    case LC_Q3_K: LC_X16_ROWS(LC_Q3_K, NP) break;                                                          \
    case LC_Q4_K: LC_X16_ROWS(LC_Q4_K, NP) break;                                                          \
    case LC_Q5_K: LC_X16_ROWS(LC_Q5_K, NP) break;                                                          \
    default: LC_X16_ROWS(LC_Q6_K, NP) break;                                                               \
    }

/* out[t, n] (row stride ldo) for the packed matrix w of n rows. Steps of more than LC_X16_ONE_PANEL rows
   take two panels per pass (each activation broadcast feeds two vpdpbusd); the panels (pairs) split
   over threads, each read once per LC_X16_MR activation rows (from L1/L2 after the first pass). From
   LC_X16_EXPAND_ROWS rows, lc_x16_expands' codes are expanded to bytes once per panel pair first. */
#include "lc_lowbit_x16.h" /* Q1_0 / Q2_0 panels */

static void LC_FN(x16_matmul)(int type, const uint8_t *w, int64_t n, int64_t k, LC_FN(xsum) x, int64_t t, void *out,
                              int out_bf16, int64_t ldo, int nth) {
    if (type == LC_Q1_0 || type == LC_Q2_0) {
        LC_FN(x16_q1)(type, w, n, k, x, t, out, out_bf16, ldo, nth);
        return;
    }
    int64_t panels = (n + 15) / 16, pb = lc_x16_panel_bytes(type, k);
    const int np = t > LC_X16_ONE_PANEL && panels > 1 ? 2 : 1;
    int64_t items = (panels + np - 1) / np;
    const int expand = np == 2 && t >= LC_X16_EXPAND_ROWS && lc_x16_expands(type);
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static)
#endif
    for (int64_t it = 0; it < items; it++) {
        int64_t p0 = it * np;
        const uint8_t *p = w + p0 * pb;
        int two = np == 2 && p0 + 1 < panels; /* a last odd panel runs alone */
        uint8_t *xc = expand ? lc_x16_expand_buffer((size_t)(32 * k)) : NULL;
        if (xc) LC_FN(x16_expand)(type, two ? 2 : 1, p, pb, k, xc);
        for (int64_t t0 = 0; t0 < t; t0 += LC_X16_MR) {
            int mr = (int)(t - t0 < LC_X16_MR ? t - t0 : LC_X16_MR);
            LC_FN(xsum) xr = {x.xq + t0 * k, x.ns16 + t0 * (k / 16), x.ns32 + t0 * (k / 32), x.dx32 + t0 * (k / 32),
                              x.fs32 + t0 * (k / 32)};
            int cols[2];
            for (int pp = 0; pp < 2; pp++) {
                int64_t left = n - 16 * (p0 + pp);
                cols[pp] = (int)(left < 16 ? left : 16);
            }
            char *dst = (char *)out + (size_t)(t0 * ldo + 16 * p0) * (out_bf16 ? 2 : 4);
            if (two) {
                LC_X16_TYPES(2)
            } else {
                LC_X16_TYPES(1)
            }
        }
    }
}
#undef LC_X16_ROWS
#undef LC_X16_TYPES
