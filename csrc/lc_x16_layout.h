/* The x16 layout: GGUF blocks repacked at load so that 16 weight rows (a "panel") sit side by side.

In GGUF form a row's 32 codes are contiguous, so a many-row step had to decode and transpose every tile
of weights on every call before its integer dot products (that fixed cost was most of a 16-sequence
step). Repacked once at load, a 64-byte load holds 4 consecutive codes of 16 rows: one vpdpbusd against
4 broadcast activation bytes adds into 16 outputs, for one activation row (decode) or many (batches),
with no transposes, no horizontal sums, and the same bytes per weight as the file (Q4_K: 148 per 256
values instead of 144, its 6-bit scales spread to bytes). Integer codes and scales are copied exactly,
so results equal the GGUF path's. Rows past the last full panel are zero.

A panel is k / unit consecutive units (unit = 32 values, 256 for the K-quants); unit layouts, with
column c = weight row p * 16 + c, f16 values, and "nibble codes" = 4 chunks of 64 bytes where byte
4c + b of chunk j holds code[c][8j + b] in its low nibble and code[c][8j + 4 + b] in its high one:
  Q4_0  d[16] | nibble codes                                       16 * 18 bytes
  Q4_1  d[16] | m[16] | nibble codes                               16 * 20
  Q8_0  d[16] | 8 chunks: byte 4c + b of chunk g = q[c][4g + b] + 128                     16 * 34
  Q4_K  d[16] | dmin[16] | sc[8][16] | min[8][16] (u8) | 8 x nibble codes (one per 32)     16 * 148
  Q6_K  d[16] | sc[16][16] (i8, per 16 values) | 8 x nibble codes of the low 4 bits | 8 x 2 chunks
        of the high 2 bits (byte 4c + b of chunk h: bits 2g..2g+1 = code[c][16h + 4g + b] >> 4)  16 * 210
Included once by lc_kernels.c (plain C: packing runs at load, unpacking only for embedding lookups). */

#define LC_X16 0x100 /* type flag: the matrix is in this layout */

static inline int lc_x16_type_ok(int type) {
    return type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q8_0 || type == LC_Q4_K || type == LC_Q6_K;
}

static inline int64_t lc_x16_unit(int type) { return type >= LC_Q2_K ? 256 : 32; }

static inline int64_t lc_x16_unit_bytes(int type) {
    switch (type) {
    case LC_Q4_0: return 16 * 18;
    case LC_Q4_1: return 16 * 20;
    case LC_Q8_0: return 16 * 34;
    case LC_Q4_K: return 16 * 148;
    default: return 16 * 210; /* LC_Q6_K */
    }
}

static inline int64_t lc_x16_panel_bytes(int type, int64_t k) { return k / lc_x16_unit(type) * lc_x16_unit_bytes(type); }

/* Where code kk (0..31) of column c sits in nibble codes: its byte, and 4 if in the high nibble. */
static inline int64_t lc_x16_nib(int c, int kk, int *shift) {
    int g = kk / 4;
    *shift = (g & 1) * 4;
    return 64 * (g / 2) + 4 * c + kk % 4;
}

static void lc_x16_put_nibbles(uint8_t *q, int c, const uint8_t *codes /* 32, each < 16 */) {
    for (int kk = 0; kk < 32; kk++) {
        int sh;
        int64_t at = lc_x16_nib(c, kk, &sh);
        q[at] = (uint8_t)(q[at] | (codes[kk] & 15) << sh);
    }
}

static void lc_x16_get_nibbles(const uint8_t *q, int c, uint8_t *codes) {
    for (int kk = 0; kk < 32; kk++) {
        int sh;
        int64_t at = lc_x16_nib(c, kk, &sh);
        codes[kk] = (q[at] >> sh) & 15;
    }
}

/* Column c of one unit from the GGUF row's block(s) `b` (the unit's values). */
static void lc_x16_pack_unit(int type, const uint8_t *b, uint8_t *u, int c) {
    uint8_t codes[32];
    float ls[8], mc[2];
    switch (type) {
    case LC_Q4_0:
    case LC_Q4_1: {
        int q1 = type == LC_Q4_1;
        memcpy(u + 2 * c, b, 2);
        if (q1) memcpy(u + 32 + 2 * c, b + 2, 2);
        if (q1) dec_q4_1_portable(b, codes, ls, mc);
        else dec_q4_0_portable(b, codes, ls, mc);
        lc_x16_put_nibbles(u + (q1 ? 64 : 32), c, codes);
        return;
    }
    case LC_Q8_0:
        memcpy(u + 2 * c, b, 2);
        for (int kk = 0; kk < 32; kk++) u[32 + 64 * (kk / 4) + 4 * c + kk % 4] = b[2 + kk] ^ 0x80;
        return;
    case LC_Q4_K:
        memcpy(u + 2 * c, b, 2);
        memcpy(u + 32 + 2 * c, b + 2, 2);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            lc_scale_min_k4(s, b + 4, &sc, &m);
            u[64 + 16 * s + c] = (uint8_t)sc;
            u[192 + 16 * s + c] = (uint8_t)m;
            dec_q4_k_portable(b, s, codes, ls, mc);
            lc_x16_put_nibbles(u + 320 + 256 * s, c, codes);
        }
        return;
    default: /* LC_Q6_K */
        memcpy(u + 2 * c, b + 208, 2);
        for (int h = 0; h < 16; h++) u[32 + 16 * h + c] = b[192 + h];
        for (int s = 0; s < 8; s++) {
            dec_q6_k_portable(b, s, codes, ls, mc);
            uint8_t *qh = u + 288 + 2048 + 128 * s;
            for (int kk = 0; kk < 32; kk++) {
                int g = kk / 4, h = g / 4;
                qh[64 * h + 4 * c + kk % 4] |= (uint8_t)((codes[kk] >> 4) << (2 * (g % 4)));
                codes[kk] &= 15;
            }
            lc_x16_put_nibbles(u + 288 + 256 * s, c, codes);
        }
        return;
    }
}

/* out (zeroed here) = the n GGUF rows of w (row_bytes apart) in panels. */
static void lc_x16_pack(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out) {
    int64_t unit = lc_x16_unit(type), ub = lc_x16_unit_bytes(type), pb = lc_x16_panel_bytes(type, k);
    int64_t bb = lc_block_bytes(type) * (unit / 32) / lc_block_subs(type); /* GGUF bytes per unit */
    int64_t panels = (n + 15) / 16;
    memset(out, 0, (size_t)(panels * pb));
    for (int64_t r = 0; r < n; r++)
        for (int64_t s = 0; s < k / unit; s++)
            lc_x16_pack_unit(type, w + r * row_bytes + s * bb, out + (r / 16) * pb + s * ub, (int)(r % 16));
}

/* Row r of a packed matrix as floats (embedding lookups), in the GGUF path's arithmetic (lc_decode.h's
   scale * code + offset), so both forms give the same values. */
static void lc_x16_row(int type, const uint8_t *w, int64_t k, int64_t r, float *out) {
    int64_t unit = lc_x16_unit(type), ub = lc_x16_unit_bytes(type);
    const uint8_t *p = w + (r / 16) * lc_x16_panel_bytes(type, k);
    int c = (int)(r % 16);
    uint8_t codes[32];
    for (int64_t s = 0; s < k / unit; s++) {
        const uint8_t *u = p + s * ub;
        float d = lc_f16(lc_u16(u + 2 * c)), *o = out + s * unit;
        switch (type) {
        case LC_Q4_0:
        case LC_Q4_1: {
            int q1 = type == LC_Q4_1;
            float m = q1 ? lc_f16(lc_u16(u + 32 + 2 * c)) : -8.0f * d;
            lc_x16_get_nibbles(u + (q1 ? 64 : 32), c, codes);
            for (int kk = 0; kk < 32; kk++) o[kk] = d * (float)codes[kk] + m;
            break;
        }
        case LC_Q8_0:
            for (int kk = 0; kk < 32; kk++) o[kk] = d * (float)u[32 + 64 * (kk / 4) + 4 * c + kk % 4] + -128.0f * d;
            break;
        case LC_Q4_K: {
            float dmin = lc_f16(lc_u16(u + 32 + 2 * c));
            for (int j = 0; j < 8; j++) {
                float sc = d * (float)u[64 + 16 * j + c], m = dmin * (float)u[192 + 16 * j + c];
                lc_x16_get_nibbles(u + 320 + 256 * j, c, codes);
                for (int kk = 0; kk < 32; kk++) o[32 * j + kk] = sc * (float)codes[kk] - m;
            }
            break;
        }
        default: /* LC_Q6_K */
            for (int j = 0; j < 8; j++) {
                const uint8_t *qh = u + 288 + 2048 + 128 * j;
                lc_x16_get_nibbles(u + 288 + 256 * j, c, codes);
                for (int kk = 0; kk < 32; kk++) {
                    int g = kk / 4, h = g / 4;
                    int q = codes[kk] | (((qh[64 * h + 4 * c + kk % 4] >> (2 * (g % 4))) & 3) << 4);
                    float sc = d * (float)(int8_t)u[32 + 16 * (2 * j + h) + c];
                    o[32 * j + kk] = sc * (float)q + -32.0f * sc;
                }
            }
            break;
        }
    }
}
