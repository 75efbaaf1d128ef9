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

/* Sub-block `s` of a row of `type` (a literal after inlining), in registers. */
static inline __attribute__((always_inline)) LC_FN(dv) LC_FN(dec_sub)(const int type, const uint8_t *w, int64_t s) {
    switch (type) {
    case LC_Q4_0: return LC_FN(decv_q4_0)(w + 18 * s);
    case LC_Q4_1: return LC_FN(decv_q4_1)(w + 20 * s);
    case LC_Q8_0: return LC_FN(decv_q8_0)(w + 34 * s);
    case LC_Q4_K: return LC_FN(decv_q4_k)(w + 144 * (s / 8), (int)(s % 8));
    case LC_Q5_K: return LC_FN(decv_q5_k)(w + 176 * (s / 8), (int)(s % 8));
    case LC_Q6_K: return LC_FN(decv_q6_k)(w + 210 * (s / 8), (int)(s % 8));
    case LC_Q2_K: return LC_FN(decv_q2_k)(w + 84 * (s / 8), (int)(s % 8));
    case LC_Q3_K: return LC_FN(decv_q3_k)(w + 110 * (s / 8), (int)(s % 8));
    case LC_Q5_0: return LC_FN(decv_q5_0)(w + 22 * s);
    default: return LC_FN(decv_q5_1)(w + 24 * s); /* LC_Q5_1: every type is listed above it */
    }
}

#if LC_ISA == LC_ISA_AVX512VNNI
static inline float LC_FN(hsum512)(__m512 v) {
    return LC_FN(hsum)(_mm256_add_ps(_mm512_castps512_ps256(v),
                                     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
static inline __m512i LC_FN(join_i)(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}
static inline __m512 LC_FN(join_f)(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1));
}
#endif

#if LC_ISA == LC_ISA_AVX512VNNI || LC_ISA == LC_ISA_AVX2
/* A Q4_K super-block's eight sub-block scales d * sc and offsets -dmin * m as float vectors. The 12
   scale bytes as three words give four 6-bit values per word operation (lc_scale_min_k4's packing),
   where unpacking them one by one took most of a decode round's instructions. */
static inline void LC_FN(q4k_scales)(const uint8_t *blk, __m256 *scf, __m256 *mnf) {
    uint32_t w0, w1, w2;
    memcpy(&w0, blk + 4, 4);
    memcpy(&w1, blk + 8, 4);
    memcpy(&w2, blk + 12, 4);
    uint64_t sc = (uint64_t)(w0 & 0x3f3f3f3fu) | ((uint64_t)((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u)) << 32);
    uint64_t mn = (uint64_t)(w1 & 0x3f3f3f3fu) |
                  ((uint64_t)(((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u)) << 32);
    *scf = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))),
                         _mm256_set1_ps(_cvtsh_ss(lc_u16(blk))));
    *mnf = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))),
                         _mm256_set1_ps(-_cvtsh_ss(lc_u16(blk + 2))));
}
#endif

#if LC_ISA == LC_ISA_AVX512VNNI
/* Eight per-sub-block values (32 codes each) as sixteen per-16-value lanes: each value twice. */
static inline __m512 LC_FN(per16)(__m256 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                 _mm512_castps256_ps512(v));
}
#endif

#ifndef LC_PF
#define LC_PF 4096
#endif
#if LC_ISA == LC_ISA_AVX512VNNI
/* Q4_0 / Q4_1 / Q8_0 rows, 16 sub-blocks (512 weights) per round, for the few-row steps decode is bound by:
   the 16 block headers come in with one gather and convert to floats at once, each pair of sub-blocks
   is one 256-bit nibble unpack, and each sub-block's scale is picked from the converted vector, so the
   loop has no scalar f16 conversions or broadcasts (the per-pair path below spends most of its
   instructions there). Returns the first sub-block it did not take. */
static inline __attribute__((always_inline)) int64_t LC_FN(legacy_groups)(
    const int type, const int mr, const uint8_t *w, int64_t k, const int8_t *xq, const float *xd,
    const float *xs, __m512 *acc, __m512 *accm) {
    const int bb = type == LC_Q4_0 ? 18 : type == LC_Q4_1 ? 20 : 34; /* block bytes */
    const int qo = type == LC_Q4_1 ? 4 : 2;                              /* where the codes start */
    const int32_t *nls = (const int32_t *)(xs + k / 16);
    const __m512i headers = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(bb));
    const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m256i low = _mm256_set1_epi8(15);
    int64_t subs = k / 32, s = 0;
    for (; s + 16 <= subs; s += 16) {
        const uint8_t *g = w + s * bb;
        for (int l = 0; l < 16 * bb; l += 64) /* every line of the round LC_PF bytes ahead */
            _mm_prefetch((const char *)(g + LC_PF + l), _MM_HINT_T0);
        __m512i hdr = _mm512_i32gather_epi32(headers, (const void *)g, 1); /* d | m (Q4_1) per block */
        __m512 dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        if (type == LC_Q4_1) {
            __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)));
            for (int i = 0; i < mr; i++) { /* xs: scale * code sum per 16, two per sub-block */
                const float *h = xs + i * LC_XS(k) + 2 * s;
                __m512 h0 = _mm512_loadu_ps(h), h1 = _mm512_loadu_ps(h + 16);
                __m512 sums = _mm512_add_ps(_mm512_permutex2var_ps(h0, even, h1), _mm512_permutex2var_ps(h0, odd, h1));
                accm[i] = _mm512_fmadd_ps(mv, sums, accm[i]);
            }
        }
        for (int j = 0; j < 8; j++) {
            const uint8_t *pa = g + 2 * j * bb + qo;
            __m512i cv;
            if (type == LC_Q8_0) { /* signed codes + 128: unsigned for dpbusd, offset -128 d */
                __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)pa)),
                                                  _mm256_loadu_si256((const __m256i *)(pa + bb)), 1);
                cv = _mm512_xor_si512(both, _mm512_set1_epi8((char)0x80));
            } else {
                __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                                    _mm_loadu_si128((const __m128i *)(pa + bb)), 1);
                __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* a_lo b_lo a_hi b_hi */
                cv = _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0));      /* a_lo a_hi b_lo b_hi */
            }
            __m512 lv = _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(2 * j)), dv);
            int64_t t = s + 2 * j;
            for (int i = 0; i < mr; i++) {
                __m512i xv = _mm512_loadu_si512((const void *)(xq + i * k + 32 * t));
                __m512 f = _mm512_mul_ps(lv, _mm512_loadu_ps(xd + i * (k / 4) + 8 * t));
                __m512i init = _mm512_setzero_si512();
                if (type != LC_Q4_1) /* offset -8 d (Q4_0), -128 d (Q8_0): start each lane at that times its activation sum */
                    init = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(nls + i * LC_XS(k) + 8 * t)),
                                             type == LC_Q4_0 ? 3 : 7);
                __m512i p = _mm512_dpbusd_epi32(init, cv, xv);
                acc[i] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc[i]);
            }
        }
    }
    return s;
}
#endif

#if LC_ISA == LC_ISA_AVX512VNNI
/* Q4_K rows for few-row steps, one 256-value super-block per round: its two f16 factors and eight 6-bit
   scale/min pairs are unpacked once into float vectors, each 32-byte run of nibbles is two sub-blocks
   (low, high) in one unpack, and the mins meet the activation sums in one vector product per round.
   Per sub-block the old path spent ~25 scalar instructions on the scale and min alone. */
static inline __attribute__((always_inline)) void LC_FN(q4k_rounds)(
    const int mr, const uint8_t *w, int64_t k, const int8_t *xq, const float *xd, const float *xs,
    __m512 *acc, __m512 *accm) {
    const __m256i low = _mm256_set1_epi8(15);
    const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + 144 * b;
        _mm_prefetch((const char *)(blk + LC_PF), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + LC_PF + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + LC_PF + 128), _MM_HINT_T0);
        __m256 scf, mnf;
        LC_FN(q4k_scales)(blk, &scf, &mnf);
        __m512 sv = _mm512_castps256_ps512(scf);
        __m512 mv = LC_FN(per16)(mnf); /* offset per 16 values */
        for (int i = 0; i < mr; i++) /* xs: scale * code sum per 16 values */
            accm[i] = _mm512_fmadd_ps(mv, _mm512_loadu_ps(xs + i * LC_XS(k) + 16 * b), accm[i]);
        for (int j = 0; j < 8; j += 2) { /* 32 bytes: sub-block j in the low nibbles, j + 1 in the high */
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 16 * j));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            __m512i cv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            __m512 lv = _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(j)), sv);
            int64_t t = 8 * b + j;
            for (int i = 0; i < mr; i++) {
                __m512i xv = _mm512_loadu_si512((const void *)(xq + i * k + 32 * t));
                __m512 f = _mm512_mul_ps(lv, _mm512_loadu_ps(xd + i * (k / 4) + 8 * t));
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cv, xv);
                acc[i] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc[i]);
            }
        }
    }
}
#endif

#if LC_ISA == LC_ISA_AVX512VNNI
/* Q6_K rows for few-row steps, one 256-value super-block per round: its 16 int8 scales become one float
   vector, and each pair of sub-blocks shares its 64 low-bit bytes (one load) and 32 high-bit bytes. The
   -32 offset folds into the integer dot product as in the per-pair path (each lane's scale covers it). */
static inline __attribute__((always_inline)) void LC_FN(q6k_rounds)(
    const int mr, const uint8_t *w, int64_t k, const int8_t *xq, const float *xd, const float *xs,
    __m512 *acc) {
    const int32_t *nls = (const int32_t *)(xs + k / 16);
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i four = _mm512_set1_epi8(15);
    const __m256i two = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + 210 * b;
        for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)(blk + LC_PF + l), _MM_HINT_T0);
        __m512 sv = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(lc_u16(blk + 208))),
                                  _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)))));
        for (int j = 0; j < 4; j++) { /* sub-blocks 2j, 2j + 1: half n = j / 2, kk = 2 (j % 2) and kk + 1 */
            int n = j / 2, kk = 2 * (j % 2);
            __m512i lo = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(blk + 64 * n)), (kk >> 1) * 4), four);
            __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            __m256i ha = _mm256_and_si256(_mm256_srli_epi16(h, 2 * kk), two);
            __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, 2 * kk + 2), two);
            __m512i hi = _mm512_slli_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(ha), hb, 1), 4);
            __m512i cv = _mm512_or_si512(lo, hi);
            __m512 lv = _mm512_permutexvar_ps(_mm512_add_epi32(quad, _mm512_set1_epi32(4 * j)), sv);
            int64_t t = 8 * b + 2 * j;
            for (int i = 0; i < mr; i++) {
                __m512i xv = _mm512_loadu_si512((const void *)(xq + i * k + 32 * t));
                __m512 f = _mm512_mul_ps(lv, _mm512_loadu_ps(xd + i * (k / 4) + 8 * t));
                __m512i init = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(nls + i * LC_XS(k) + 8 * t)), 5);
                __m512i p = _mm512_dpbusd_epi32(init, cv, xv);
                acc[i] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc[i]);
            }
        }
    }
}
#endif

#if LC_ISA == LC_ISA_AVX512VNNI
/* Q2_K / Q3_K rows for few-row steps, one 256-value super-block per round as in q6k_rounds: the 16
   scales per 16 values become one float vector (Q3_K's 6-bit ones unpacked in a few byte operations,
   Q2_K's nibbles), each pair of sub-blocks shares one 32-byte load of 2-bit codes (and Q3_K one of its
   high bits). Q3_K's offset (-4 x scale) folds into the integer dot product; Q2_K's (-dmin x m, per 16
   values) meets the activation sums once per round. */
static inline __attribute__((always_inline)) void LC_FN(lowbit_rounds)(
    const int type, const int mr, const uint8_t *w, int64_t k, const int8_t *xq, const float *xd,
    const float *xs, __m512 *acc, __m512 *accm) {
    const int32_t *nls = (const int32_t *)(xs + k / 16);
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m256i two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m128i nib = _mm_set1_epi8(15);
    const int q3 = type == LC_Q3_K, bb = q3 ? 110 : 84;
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + bb * b;
        for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)(blk + LC_PF + l), _MM_HINT_T0);
        __m512 sv, mv = _mm512_setzero_ps();
        if (q3) { /* scale j: low 4 bits in byte j % 8 (high nibble for j >= 8), high 2 in byte 8 + j % 4 */
            __m128i v = _mm_loadl_epi64((const __m128i *)(blk + 96));
            __m128i low = _mm_unpacklo_epi64(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
            int32_t h;
            memcpy(&h, blk + 104, 4);
            __m128i high = _mm_and_si128(_mm_setr_epi32(h, h >> 2, h >> 4, h >> 6), _mm_set1_epi8(3));
            __m128i sc = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
            sv = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(lc_u16(blk + 108))), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
        } else {
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
            sv = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(lc_u16(blk + 80))),
                               _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15))));
            mv = _mm512_mul_ps(_mm512_set1_ps(-_cvtsh_ss(lc_u16(blk + 82))),
                               _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)));
        }
        const uint8_t *qs = blk + (q3 ? 32 : 16);
        const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) { /* sub-blocks 2j, 2j + 1: codes bytes 32 (j / 2).., shifts 4 (j % 2) and +2 */
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            int sh = 4 * (j % 2);
            __m256i la = _mm256_and_si256(_mm256_srli_epi16(v, sh), two);
            __m256i lb = _mm256_and_si256(_mm256_srli_epi16(v, sh + 2), two);
            if (q3) { /* third bit: bit s of high-mask byte l, for sub-block s */
                la = _mm256_or_si256(la, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 2 * j), one), 2));
                lb = _mm256_or_si256(lb, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 2 * j + 1), one), 2));
            }
            __m512i cv = _mm512_inserti64x4(_mm512_castsi256_si512(la), lb, 1);
            __m512 lv = _mm512_permutexvar_ps(_mm512_add_epi32(quad, _mm512_set1_epi32(4 * j)), sv);
            int64_t t = 8 * b + 2 * j;
            for (int i = 0; i < mr; i++) {
                __m512i xv = _mm512_loadu_si512((const void *)(xq + i * k + 32 * t));
                __m512 f = _mm512_mul_ps(lv, _mm512_loadu_ps(xd + i * (k / 4) + 8 * t));
                __m512i init = q3 ? _mm512_slli_epi32(_mm512_loadu_si512((const void *)(nls + i * LC_XS(k) + 8 * t)), 2)
                                  : _mm512_setzero_si512();
                __m512i p = _mm512_dpbusd_epi32(init, cv, xv);
                acc[i] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc[i]);
            }
        }
        if (!q3) /* offsets per 16 values times the activation sums per 16 */
            for (int i = 0; i < mr; i++) accm[i] = _mm512_fmadd_ps(mv, _mm512_loadu_ps(xs + i * LC_XS(k) + 16 * b), accm[i]);
    }
}
#endif

#if LC_ISA == LC_ISA_AVX2
/* Q4_K / Q6_K rows for few-row steps on AVX2, one super-block per round: every sub-block's scales and
   offsets are unpacked once into per-lane tables (instead of per sub-block inside the dot loop), and
   the offsets meet the activation sums in two vector products per round. */
static inline __attribute__((always_inline)) void LC_FN(kq_rounds)(
    const int type, const int mr, const uint8_t *w, int64_t k, const int8_t *xq, const float *xd,
    const float *xs, __m256 acc[4][2], __m256 *accm) {
    const __m256i low = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    const int bb = type == LC_Q4_K ? 144 : 210;
    const __m256i dup0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), dup1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 scf = _mm256_setzero_ps(), s0 = scf, s1 = scf, m0, m1;
    for (int64_t b = 0; b < k / 256; b++) {
        const uint8_t *blk = w + bb * b;
        for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)(blk + 4096 + l), _MM_HINT_T0);
        if (type == LC_Q4_K) { /* scales per sub-block, offsets per 16 values */
            __m256 mnf;
            LC_FN(q4k_scales)(blk, &scf, &mnf);
            m0 = _mm256_permutevar8x32_ps(mnf, dup0);
            m1 = _mm256_permutevar8x32_ps(mnf, dup1);
        } else { /* 16 int8 scales, one per 16 values, converted as two vectors */
            __m256 d = _mm256_set1_ps(_cvtsh_ss(lc_u16(blk + 208)));
            __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
            s0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
            s1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
            m0 = _mm256_mul_ps(_mm256_set1_ps(-32.0f), s0);
            m1 = _mm256_mul_ps(_mm256_set1_ps(-32.0f), s1);
        }
        for (int i = 0; i < mr; i++) {
            const float *h = xs + i * LC_XS(k) + 16 * b; /* scale * code sum per 16 */
            accm[i] = _mm256_fmadd_ps(m0, _mm256_loadu_ps(h), _mm256_fmadd_ps(m1, _mm256_loadu_ps(h + 8), accm[i]));
        }
        for (int j = 0; j < 8; j += 2) {
            __m256i ca, cb;
            __m256 sa, sb;
            if (type == LC_Q4_K) { /* 32 bytes: sub-block j in the low nibbles, j + 1 in the high */
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 16 * j));
                ca = _mm256_and_si256(v, low);
                cb = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                sa = _mm256_permutevar8x32_ps(scf, _mm256_set1_epi32(j));
                sb = _mm256_permutevar8x32_ps(scf, _mm256_set1_epi32(j + 1));
            } else { /* sub-blocks j = 4n + kk (kk even) and j + 1 share half n's bytes */
                int n = j / 4, kk = j % 4;
                __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
                int lshift = (kk >> 1) * 4;
                __m256i la = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(blk + 64 * n)), lshift), low);
                __m256i lb = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32)), lshift), low);
                ca = _mm256_or_si256(la, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * kk), two), 4));
                cb = _mm256_or_si256(lb, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * kk + 2), two), 4));
                /* sub-block j: scales 2j (lanes 0-3) and 2j + 1 (lanes 4-7) */
                __m256 half = j < 4 ? s0 : s1;
                int q = 2 * (j % 4);
                sa = _mm256_permutevar8x32_ps(half, _mm256_setr_epi32(q, q, q, q, q + 1, q + 1, q + 1, q + 1));
                sb = _mm256_permutevar8x32_ps(half, _mm256_setr_epi32(q + 2, q + 2, q + 2, q + 2, q + 3, q + 3, q + 3, q + 3));
            }
            int64_t t = 8 * b + j;
            for (int i = 0; i < mr; i++) {
                const int8_t *x = xq + i * k + 32 * t;
                const float *dx = xd + i * (k / 4) + 8 * t;
                __m256i pa = LC_FN(dot8)(ca, _mm256_loadu_si256((const __m256i *)x), 0);
                __m256i pb = LC_FN(dot8)(cb, _mm256_loadu_si256((const __m256i *)(x + 32)), 0);
                acc[i][0] = _mm256_fmadd_ps(_mm256_mul_ps(sa, _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(pa), acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(_mm256_mul_ps(sb, _mm256_loadu_ps(dx + 8)), _mm256_cvtepi32_ps(pb), acc[i][1]);
            }
        }
    }
}
#endif

/* Few activation rows (decode steps): each weight sub-block is decoded into registers and used at
   once by every row; AVX-512 takes two sub-blocks per instruction. xd holds one scale per lane. */
static inline __attribute__((always_inline)) void LC_FN(fused)(
    const int type, const int mr, const uint8_t *w, int64_t k, const int8_t *xq, const float *xd,
    const float *xs, float *res) {
    const int wide = type == LC_Q8_0;
    float corr[4] = {0, 0, 0, 0};
    /* offsets times activation sums, 4 halves at a time: a scalar sum would chain its latency */
    __m128 cv4[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    int64_t subs = k / 32, s = 0;
#if LC_ISA == LC_ISA_AVX512VNNI
    /* Types whose offset is -2^n * scale (Q4_0, Q5_0, Q8_0, Q6_K) fold it into the integer dot product:
       the scalar-free loop is what one-row steps are bound by. */
    const int shift = type == LC_Q4_0 ? 3 : type == LC_Q5_0 ? 4 : type == LC_Q6_K ? 5 : type == LC_Q8_0 ? 7 : -1;
    const int32_t *nls = (const int32_t *)(xs + k / 16);
    __m512 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
    const int64_t sub_bytes8 = lc_block_bytes(type) * 8 / lc_block_subs(type); /* bytes per 8 subs */
    __m512 accm[4]; /* Q4_1: offsets times activation sums, 16 sub-blocks per instruction */
    for (int i = 0; i < 4; i++) accm[i] = _mm512_setzero_ps();
    if (type == LC_Q4_K) { /* whole super-blocks: K is a multiple of 256 for the K-quants */
        LC_FN(q4k_rounds)(mr, w, k, xq, xd, xs, acc, accm);
        s = subs;
    }
    if (type == LC_Q6_K) {
        LC_FN(q6k_rounds)(mr, w, k, xq, xd, xs, acc);
        s = subs;
    }
    if (type == LC_Q2_K || type == LC_Q3_K) {
        LC_FN(lowbit_rounds)(type, mr, w, k, xq, xd, xs, acc, accm);
        s = subs;
    }
    if (type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q8_0)
        s = LC_FN(legacy_groups)(type, mr, w, k, xq, xd, xs, acc, accm);
    for (; s + 2 <= subs; s += 2) {
        /* the weights stream from memory once: ask for them ~1 KiB ahead */
        _mm_prefetch((const char *)(w + s * sub_bytes8 / 8 + 1024), _MM_HINT_T0);
        LC_FN(dv) a = LC_FN(dec_sub)(type, w, s), b = LC_FN(dec_sub)(type, w, s + 1);
        __m512i cv = LC_FN(join_i)(a.c, b.c);
        __m512 lv = LC_FN(join_f)(a.ls, b.ls);
        for (int i = 0; i < mr; i++) {
            __m512i xv = _mm512_loadu_si512((const void *)(xq + i * k + 32 * s));
            __m512 f = _mm512_mul_ps(lv, _mm512_loadu_ps(xd + i * (k / 4) + 8 * s));
            __m512i init = _mm512_setzero_si512();
            if (shift >= 0) /* offset 2^shift: start each lane at -2^shift * (its activation sum) */
                init = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(nls + i * LC_XS(k) + 8 * s)), shift);
            __m512i p = _mm512_dpbusd_epi32(init, cv, xv);
            acc[i] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc[i]);
            if (shift < 0) {
                __m128 mv = _mm_setr_ps(a.mc[0], a.mc[1], b.mc[0], b.mc[1]);
                cv4[i] = _mm_fmadd_ps(mv, _mm_loadu_ps(xs + i * LC_XS(k) + 2 * s), cv4[i]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum512)(_mm512_add_ps(acc[i], accm[i]));
#else
    __m256 acc[4][2], accm[4];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = accm[i] = _mm256_setzero_ps();
    if (type == LC_Q4_K || type == LC_Q6_K) { /* whole super-blocks: K is a multiple of 256 */
        LC_FN(kq_rounds)(type, mr, w, k, xq, xd, xs, acc, accm);
        s = subs;
    }
    for (; s + 2 <= subs; s += 2) {
        LC_FN(dv) a = LC_FN(dec_sub)(type, w, s), b = LC_FN(dec_sub)(type, w, s + 1);
        for (int i = 0; i < mr; i++) {
            const int8_t *x = xq + i * k + 32 * s;
            const float *dx = xd + i * (k / 4) + 8 * s;
            __m256i pa = LC_FN(dot8)(a.c, _mm256_loadu_si256((const __m256i *)x), wide);
            __m256i pb = LC_FN(dot8)(b.c, _mm256_loadu_si256((const __m256i *)(x + 32)), wide);
            acc[i][0] = _mm256_fmadd_ps(_mm256_mul_ps(a.ls, _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(pa), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_mul_ps(b.ls, _mm256_loadu_ps(dx + 8)), _mm256_cvtepi32_ps(pb), acc[i][1]);
            __m128 mv = _mm_setr_ps(a.mc[0], a.mc[1], b.mc[0], b.mc[1]);
            cv4[i] = _mm_fmadd_ps(mv, _mm_loadu_ps(xs + i * LC_XS(k) + 2 * s), cv4[i]);
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum)(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]), accm[i]));
#endif
    for (; s < subs; s++) { /* an odd last sub-block */
        LC_FN(dv) a = LC_FN(dec_sub)(type, w, s);
        for (int i = 0; i < mr; i++) {
            __m256i p = LC_FN(dot8)(a.c, _mm256_loadu_si256((const __m256i *)(xq + i * k + 32 * s)), wide);
            __m256 f = _mm256_mul_ps(a.ls, _mm256_loadu_ps(xd + i * (k / 4) + 8 * s));
            res[i] += LC_FN(hsum)(_mm256_mul_ps(f, _mm256_cvtepi32_ps(p)));
            corr[i] += a.mc[0] * xs[i * LC_XS(k) + 2 * s] + a.mc[1] * xs[i * LC_XS(k) + 2 * s + 1];
        }
    }
    for (int i = 0; i < mr; i++) {
        __m128 v = cv4[i];
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        res[i] += corr[i] + _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
    }
}

#define LC_FUSED_TYPE(T)                                                                                \
    switch (mr) {                                                                                       \
    case 1: LC_FN(fused)(T, 1, row, k, xq, xd, xs, res); break;                                         \
    case 2: LC_FN(fused)(T, 2, row, k, xq, xd, xs, res); break;                                         \
    case 3: LC_FN(fused)(T, 3, row, k, xq, xd, xs, res); break;                                         \
    default: LC_FN(fused)(T, 4, row, k, xq, xd, xs, res); break;                                        \
    }

static void LC_FN(fused_rows)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k,
                              int64_t row_bytes, const int8_t *xq, const float *xd, const float *xs,
                              int64_t t0, int mr, void *out, int out_bf16, int64_t ldo) {
    xq += t0 * k;
    xd += t0 * (k / 4);
    xs += t0 * LC_XS(k);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w + n * row_bytes;
        float res[4];
        switch (type) {
        case LC_Q4_0: LC_FUSED_TYPE(LC_Q4_0) break;
        case LC_Q4_1: LC_FUSED_TYPE(LC_Q4_1) break;
        case LC_Q5_0: LC_FUSED_TYPE(LC_Q5_0) break;
        case LC_Q5_1: LC_FUSED_TYPE(LC_Q5_1) break;
        case LC_Q8_0: LC_FUSED_TYPE(LC_Q8_0) break;
        case LC_Q2_K: LC_FUSED_TYPE(LC_Q2_K) break;
        case LC_Q3_K: LC_FUSED_TYPE(LC_Q3_K) break;
        case LC_Q4_K: LC_FUSED_TYPE(LC_Q4_K) break;
        case LC_Q5_K: LC_FUSED_TYPE(LC_Q5_K) break;
        default: LC_FUSED_TYPE(LC_Q6_K) break;
        }
        for (int i = 0; i < mr; i++) lc_store(out, out_bf16, (t0 + i) * ldo + n, res[i]);
    }
}
#endif

#if LC_ISA == LC_ISA_PORTABLE
/* Many activation rows in portable C (AVX2: lc_gemm256.h, AVX-512: lc_gemm512.h): a 4 x 2 tile
   (activation rows x decoded weight rows) of dot products. */
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
#endif

/* sum(a[i] * b[i]): the offsets times the activation sums, once per output (n = k / 16). */
static inline float LC_FN(dotf)(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#if LC_ISA == LC_ISA_AVX512VNNI
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    s = LC_FN(hsum512)(acc);
#elif LC_ISA == LC_ISA_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = LC_FN(hsum)(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

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

#define LC_TILE_MR 4

#if LC_ISA == LC_ISA_PORTABLE
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
#endif

/* The many-row path of this ISA: its tile of weight rows, the scratch it needs per tile weight (gemm_rows
   keeps the interleaved tile and the decoded rows), and the function. */
#if LC_ISA == LC_ISA_AVX512VNNI
#include "lc_gemm512.h"
#define LC_MANY_TILE LC_GN
#define LC_MANY_SCRATCH 2
#define LC_MANY_ROWS LC_FN(gemm_rows)
#elif LC_ISA == LC_ISA_AVX2
#include "lc_gemm256.h"
#define LC_MANY_TILE LC_HN
#define LC_MANY_SCRATCH 2
#define LC_MANY_ROWS LC_FN(gemm2_rows)
#else
#define LC_MANY_TILE 16
#define LC_MANY_SCRATCH 1
#define LC_MANY_ROWS LC_FN(rows)
#endif

static void LC_FN(matmul)(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes,
                          const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                          int out_bf16, int64_t ldo, int nth) {
    /* Weight rows are decoded once per tile and reused by every activation row (the tile stays in
       L2); few-row steps take small tiles so both threads get work. */
    int64_t tile = t <= LC_TILE_MR ? 4 : LC_MANY_TILE;
    int64_t tiles = (n + tile - 1) / tile;
#ifdef _OPENMP
#pragma omp parallel num_threads(nth)
#endif
    {
        uint8_t *c;
        float *ls, *mc;
        lc_scratch(t <= LC_TILE_MR ? tile * k : LC_MANY_SCRATCH * tile * k, &c, &ls, &mc);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < tiles; i++) {
            int64_t n0 = i * tile, n1 = n0 + tile < n ? n0 + tile : n;
#if LC_ISA != LC_ISA_PORTABLE
            if (t <= LC_TILE_MR) {
                LC_FN(fused_rows)(type, w, n0, n1, k, row_bytes, xq, xd, xs, 0, (int)t, out, out_bf16, ldo);
                continue;
            }
#endif
            LC_MANY_ROWS(type, w, n0, n1, k, row_bytes, xq, xd, xs, t, out, out_bf16, ldo, c, ls, mc);
        }
    }
}
#undef LC_MANY_TILE
#undef LC_MANY_SCRATCH
#undef LC_MANY_ROWS

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
