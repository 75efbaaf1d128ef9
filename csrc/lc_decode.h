/* Block decoders of the GGUF-layout reference (lc_impl.h's portable matmul and dequant; lc_x16_layout.h
packs from them too).

Each GGUF block type is decoded, 32 weights at a time, into one common form the dot kernels read:
  codes[32]  unsigned 8-bit codes,
  lscale[8]  one float scale per 4 consecutive codes (a dot-product lane),
  minc[2]    one float offset per 16 codes,
so that weight j = lscale[j / 4] * codes[j] + minc[j / 16]. Every type fits: Q4_0 is d * (q - 8)
(codes q, offset -8d), Q8_0 is d * q with q signed (codes q + 128, offset -128d), Q4_K/Q5_K are
d * sc * q - dmin * m per 32, Q6_K has one scale per 16 (hence per-lane scales and per-16 offsets).
Against activations quantized to x = dx * xq per 32 (sums sx of xq per 16), a block's dot product is
dx * sum_lanes(lscale * int_dot(codes, xq)) + sum_halves(minc * dx * sx): integer products are exact. */

#define LC_SUB 32 /* codes per decoded sub-block */

static inline void LC_FN(dec_q4_0)(const uint8_t *b, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b));
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) { c[j] = qs[j] & 15; c[j + 16] = qs[j] >> 4; }
    for (int l = 0; l < 8; l++) ls[l] = d;
    mc[0] = mc[1] = -8.0f * d;
}

static inline void LC_FN(dec_q4_1)(const uint8_t *b, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b)), m = lc_f16(lc_u16(b + 2));
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) { c[j] = qs[j] & 15; c[j + 16] = qs[j] >> 4; }
    for (int l = 0; l < 8; l++) ls[l] = d;
    mc[0] = mc[1] = m;
}

static inline void LC_FN(dec_q5_0)(const uint8_t *b, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b));
    uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        c[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
        c[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    for (int l = 0; l < 8; l++) ls[l] = d;
    mc[0] = mc[1] = -16.0f * d;
}

static inline void LC_FN(dec_q5_1)(const uint8_t *b, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b)), m = lc_f16(lc_u16(b + 2));
    uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        c[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
        c[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    for (int l = 0; l < 8; l++) ls[l] = d;
    mc[0] = mc[1] = m;
}

static inline void LC_FN(dec_q8_0)(const uint8_t *b, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b));
    for (int j = 0; j < 32; j++) c[j] = b[2 + j] ^ 0x80; /* two's complement q + 128 */
    for (int l = 0; l < 8; l++) ls[l] = d;
    mc[0] = mc[1] = -128.0f * d;
}

#ifndef LC_SCALE_MIN_K4
#define LC_SCALE_MIN_K4
/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (GGML's packing). */
static inline void lc_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
    else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
#endif

/* Super-blocks of 256: decode sub-block `i` (0..7) of block `b`. */
static inline void LC_FN(dec_q4_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b)), dmin = lc_f16(lc_u16(b + 2));
    int sc, m;
    lc_scale_min_k4(i, b + 4, &sc, &m);
    const uint8_t *q = b + 16 + 32 * (i / 2);
    int shift = (i & 1) * 4;
    for (int l = 0; l < 32; l++) c[l] = (q[l] >> shift) & 15;
    for (int l = 0; l < 8; l++) ls[l] = d * (float)sc;
    mc[0] = mc[1] = -dmin * (float)m;
}

static inline void LC_FN(dec_q5_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) {
    float d = lc_f16(lc_u16(b)), dmin = lc_f16(lc_u16(b + 2));
    int sc, m;
    lc_scale_min_k4(i, b + 4, &sc, &m);
    const uint8_t *qh = b + 16, *q = b + 48 + 32 * (i / 2);
    int shift = (i & 1) * 4;
    for (int l = 0; l < 32; l++) c[l] = (uint8_t)(((q[l] >> shift) & 15) | (((qh[l] >> i) & 1) << 4));
    for (int l = 0; l < 8; l++) ls[l] = d * (float)sc;
    mc[0] = mc[1] = -dmin * (float)m;
}

static inline void LC_FN(dec_q6_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) {
    int n = i / 4, k = i % 4;
    const uint8_t *ql = b + 64 * n + (k & 1) * 32, *qh = b + 128 + 32 * n;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * n + 2 * k;
    float d = lc_f16(lc_u16(b + 208));
    int lshift = (k >> 1) * 4, hshift = 2 * k;
    for (int l = 0; l < 32; l++)
        c[l] = (uint8_t)(((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4));
    float s0 = d * (float)sc[0], s1 = d * (float)sc[1];
    for (int l = 0; l < 4; l++) { ls[l] = s0; ls[l + 4] = s1; }
    mc[0] = -32.0f * s0; mc[1] = -32.0f * s1;
}

/* Q2_K: 16 scale bytes (low nibble scale, high nibble min, per 16 values), 64 bytes of 2-bit codes, d,
   dmin. Sub-block i (32 values) is codes bytes 32 * (i / 4).. shifted by 2 * (i % 4); weight =
   d * (sc & 15) * q - dmin * (sc >> 4). */
static inline void LC_FN(dec_q2_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) {
    const uint8_t *sc = b + 2 * i, *q = b + 16 + 32 * (i / 4);
    float d = lc_f16(lc_u16(b + 80)), dmin = lc_f16(lc_u16(b + 82));
    int shift = 2 * (i % 4);
    for (int l = 0; l < 32; l++) c[l] = (uint8_t)((q[l] >> shift) & 3);
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 4; l++) ls[4 * h + l] = d * (float)(sc[h] & 15);
        mc[h] = -dmin * (float)(sc[h] >> 4);
    }
}

/* Q3_K: 32 bytes of high bits, 64 bytes of low 2-bit codes, 12 bytes of 6-bit scales (per 16 values,
   stored + 32), d. Value l of sub-block i: low bits as in Q2_K, high bit l's bit i; weight =
   d * (sc - 32) * (q - 4), q = low | high << 2 in 0..7 (a clear high bit means -4, as ggml writes it). */
/* Scale j (0..15) of a Q3_K block, minus its +32: low 4 bits in bytes 0-7, high 2 in bytes 8-11. */
static inline int LC_FN(q3k_scale)(const uint8_t *sb, int j) {
    return (((sb[j % 8] >> (4 * (j / 8))) & 15) | (((sb[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

static inline void LC_FN(dec_q3_k)(const uint8_t *b, int i, uint8_t *c, float *ls, float *mc) {
    const uint8_t *hm = b, *q = b + 32 + 32 * (i / 4);
    float d = lc_f16(lc_u16(b + 108));
    int shift = 2 * (i % 4);
    for (int l = 0; l < 32; l++) c[l] = (uint8_t)(((q[l] >> shift) & 3) | (((hm[l] >> i) & 1) << 2));
    for (int h = 0; h < 2; h++) {
        float s = d * (float)LC_FN(q3k_scale)(b + 96, 2 * i + h);
        for (int l = 0; l < 4; l++) ls[4 * h + l] = s;
        mc[h] = -4.0f * s;
    }
}


/* Decode one row of `k` weights (row bytes `w`) into codes[k], lscale[k / 4], minc[k / 16]. */
static void LC_FN(decode_row)(int type, const uint8_t *w, int64_t k, uint8_t *c, float *ls, float *mc) {
    int64_t subs = k / LC_SUB;
    switch (type) {
    case LC_Q4_0: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q4_0)(w + 18 * s, c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q4_1: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q4_1)(w + 20 * s, c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q5_0: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q5_0)(w + 22 * s, c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q5_1: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q5_1)(w + 24 * s, c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q8_0: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q8_0)(w + 34 * s, c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q2_K: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q2_k)(w + 84 * (s / 8), (int)(s % 8), c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q3_K: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q3_k)(w + 110 * (s / 8), (int)(s % 8), c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q4_K: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q4_k)(w + 144 * (s / 8), (int)(s % 8), c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q5_K: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q5_k)(w + 176 * (s / 8), (int)(s % 8), c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    case LC_Q6_K: for (int64_t s = 0; s < subs; s++) LC_FN(dec_q6_k)(w + 210 * (s / 8), (int)(s % 8), c + 32 * s, ls + 8 * s, mc + 2 * s); break;
    default: break;
    }
}
