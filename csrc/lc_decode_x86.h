/* SIMD versions of the hot decoders in lc_decode.h (same outputs), for the x86 variants: `decv_*`
return the codes and lane scales in registers, `dec_*` store them like the portable ones. */

typedef struct { __m256i c; __m256 ls; float mc[2]; } LC_FN(dv);

static inline __m256i LC_FN(nibbles16)(const uint8_t *q) { /* 16 bytes -> 32 codes */
    const __m128i low = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
    return _mm256_set_m128i(hi, lo);
}

static inline __m256i LC_FN(bits)(const uint8_t *p, int shift, int mask) { /* (p[l] >> shift) & mask */
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8((char)mask));
}

static inline LC_FN(dv) LC_FN(uniform)(__m256i c, float d, float m) {
    LC_FN(dv) r;
    r.c = c;
    r.ls = _mm256_set1_ps(d);
    r.mc[0] = r.mc[1] = m;
    return r;
}

static inline LC_FN(dv) LC_FN(decv_q4_0)(const uint8_t *b) {
    float d = _cvtsh_ss(lc_u16(b));
    return LC_FN(uniform)(LC_FN(nibbles16)(b + 2), d, -8.0f * d);
}

static inline LC_FN(dv) LC_FN(decv_q4_1)(const uint8_t *b) {
    return LC_FN(uniform)(LC_FN(nibbles16)(b + 4), _cvtsh_ss(lc_u16(b)), _cvtsh_ss(lc_u16(b + 2)));
}

/* 32 codes: the nibbles of 16 bytes (value j < 16 low, j + 16 high) plus bit j of the 32-bit qh as
   bit 4. Each byte j picks qh's byte j / 8 (both 128-bit lanes hold all of qh), keeps bit j % 8, and
   turns it into 16 by a compare. */
static inline __m256i LC_FN(nibbles16_high)(const uint8_t *q, const uint8_t *qh) {
    int32_t h;
    memcpy(&h, qh, 4);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i spread = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(h), pick), bit);
    __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(spread, bit), _mm256_set1_epi8(16));
    return _mm256_or_si256(LC_FN(nibbles16)(q), high);
}

static inline LC_FN(dv) LC_FN(decv_q5_0)(const uint8_t *b) {
    float d = _cvtsh_ss(lc_u16(b));
    return LC_FN(uniform)(LC_FN(nibbles16_high)(b + 6, b + 2), d, -16.0f * d);
}

static inline LC_FN(dv) LC_FN(decv_q5_1)(const uint8_t *b) {
    return LC_FN(uniform)(LC_FN(nibbles16_high)(b + 8, b + 4), _cvtsh_ss(lc_u16(b)), _cvtsh_ss(lc_u16(b + 2)));
}

static inline LC_FN(dv) LC_FN(decv_q8_0)(const uint8_t *b) {
    float d = _cvtsh_ss(lc_u16(b));
    __m256i v = _mm256_loadu_si256((const __m256i *)(b + 2));
    return LC_FN(uniform)(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)), d, -128.0f * d);
}

static inline LC_FN(dv) LC_FN(decv_q4_k)(const uint8_t *b, int i) {
    int sc, m;
    lc_scale_min_k4(i, b + 4, &sc, &m);
    __m256i c = LC_FN(bits)(b + 16 + 32 * (i / 2), (i & 1) * 4, 15);
    return LC_FN(uniform)(c, _cvtsh_ss(lc_u16(b)) * (float)sc, -_cvtsh_ss(lc_u16(b + 2)) * (float)m);
}

static inline LC_FN(dv) LC_FN(decv_q5_k)(const uint8_t *b, int i) {
    int sc, m;
    lc_scale_min_k4(i, b + 4, &sc, &m);
    __m256i lo = LC_FN(bits)(b + 48 + 32 * (i / 2), (i & 1) * 4, 15);
    __m256i hi = _mm256_slli_epi16(LC_FN(bits)(b + 16, i, 1), 4);
    return LC_FN(uniform)(_mm256_or_si256(lo, hi), _cvtsh_ss(lc_u16(b)) * (float)sc,
                          -_cvtsh_ss(lc_u16(b + 2)) * (float)m);
}

static inline LC_FN(dv) LC_FN(decv_q6_k)(const uint8_t *b, int i) {
    int n = i / 4, k = i % 4;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * n + 2 * k;
    float d = _cvtsh_ss(lc_u16(b + 208));
    __m256i lo = LC_FN(bits)(b + 64 * n + (k & 1) * 32, (k >> 1) * 4, 15);
    __m256i hi = _mm256_slli_epi16(LC_FN(bits)(b + 128 + 32 * n, 2 * k, 3), 4);
    float s0 = d * (float)sc[0], s1 = d * (float)sc[1];
    LC_FN(dv) r;
    r.c = _mm256_or_si256(lo, hi);
    r.ls = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
    r.mc[0] = -32.0f * s0;
    r.mc[1] = -32.0f * s1;
    return r;
}

static inline LC_FN(dv) LC_FN(two_scales)(__m256i c, float s0, float s1, float m0, float m1) {
    LC_FN(dv) r;
    r.c = c;
    r.ls = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
    r.mc[0] = m0;
    r.mc[1] = m1;
    return r;
}

static inline __attribute__((always_inline)) LC_FN(dv) LC_FN(decv_q2_k)(const uint8_t *b, int i) { /* layout: lc_decode.h's dec_q2_k */
    float d = _cvtsh_ss(lc_u16(b + 80)), dmin = _cvtsh_ss(lc_u16(b + 82));
    int sc0 = b[2 * i], sc1 = b[2 * i + 1];
    __m256i c = LC_FN(bits)(b + 16 + 32 * (i / 4), 2 * (i % 4), 3);
    return LC_FN(two_scales)(c, d * (float)(sc0 & 15), d * (float)(sc1 & 15), -dmin * (float)(sc0 >> 4),
                             -dmin * (float)(sc1 >> 4));
}

static inline __attribute__((always_inline)) LC_FN(dv) LC_FN(decv_q3_k)(const uint8_t *b, int i) { /* layout: lc_decode.h's dec_q3_k */
    float d = _cvtsh_ss(lc_u16(b + 108));
    __m256i lo = LC_FN(bits)(b + 32 + 32 * (i / 4), 2 * (i % 4), 3);
    __m256i hi = _mm256_slli_epi16(LC_FN(bits)(b, i, 1), 2);
    float s0 = d * (float)LC_FN(q3k_scale)(b + 96, 2 * i), s1 = d * (float)LC_FN(q3k_scale)(b + 96, 2 * i + 1);
    return LC_FN(two_scales)(_mm256_or_si256(lo, hi), s0, s1, -4.0f * s0, -4.0f * s1);
}

static inline void LC_FN(put)(LC_FN(dv) r, uint8_t *c, float *ls, float *mc) {
    _mm256_storeu_si256((__m256i *)c, r.c);
    _mm256_storeu_ps(ls, r.ls);
    mc[0] = r.mc[0];
    mc[1] = r.mc[1];
}

static inline void LC_FN(dec_q4_0)(const uint8_t *b, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q4_0)(b), c, ls, mc); }
static inline void LC_FN(dec_q4_1)(const uint8_t *b, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q4_1)(b), c, ls, mc); }
static inline void LC_FN(dec_q8_0)(const uint8_t *b, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q8_0)(b), c, ls, mc); }
static inline void LC_FN(dec_q4_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q4_k)(b, i), c, ls, mc); }
static inline void LC_FN(dec_q5_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q5_k)(b, i), c, ls, mc); }
static inline void LC_FN(dec_q6_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q6_k)(b, i), c, ls, mc); }
static inline void LC_FN(dec_q5_0)(const uint8_t *b, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q5_0)(b), c, ls, mc); }
static inline void LC_FN(dec_q5_1)(const uint8_t *b, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q5_1)(b), c, ls, mc); }
static inline void LC_FN(dec_q2_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q2_k)(b, i), c, ls, mc); }
static inline void LC_FN(dec_q3_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) { LC_FN(put)(LC_FN(decv_q3_k)(b, i), c, ls, mc); }
