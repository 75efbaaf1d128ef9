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
  Q5_0  d[16] | nibble codes of the low 4 bits | fifth bits (byte 4c + b: bit g = code[c][4g + b] >> 4)   16 * 22
  Q5_1  d[16] | m[16] | nibble codes | fifth bits, as Q5_0's       16 * 24
  Q8_0  d[16] | 8 chunks: byte 4c + b of chunk g = q[c][4g + b] + 128                     16 * 34
  Q2_K  d[16] | dmin[16] | 8 x (sm[2][16] (the file's bytes: scale | min << 4, per 16 values) | 2 chunks
        of the 2-bit codes (as Q3_K's low bits))                                            16 * 84
  Q3_K  d[16] | 8 x (sc[2][16] (i8, per 16 values, minus the file's +32) | 2 chunks of the low 2 bits
        (as Q6_K's high bits: byte 4c + b of chunk h, bits 2g..2g+1 = code[c][16h + 4g + b] & 3) | the
        third bits (byte 4c + b: bit g = code[c][4g + b] >> 2)); codes 0..7, offset -4 x scale     16 * 114
  Q4_K  d[16] | dmin[16] | sc[8][16] | min[8][16] (u8) | 8 x nibble codes (one per 32)     16 * 148
        (The file's packed 6-bit scales, 144 bytes, unpacked per unit in the kernels, were tried: one-row
        decode of the real 1.5B Q4_K_M read 1.00-1.02x, many-row Q4_K matmuls 2-4% slower; docs/performance.md.)
  Q5_K  as Q4_K, with each 32 values' nibble codes followed by a 64-byte chunk of their fifth bits
        (byte 4c + b: bit g = code[c][4g + b] >> 4)                                        16 * 180
  Q6_K  d[16] | 8 x (sc[2][16] (i8, per 16 values) | nibble codes of the low 4 bits | 2 chunks of
        the high 2 bits (byte 4c + b of chunk h: bits 2g..2g+1 = code[c][16h + 4g + b] >> 4))   16 * 210
        Each 32 values' scales and codes are adjacent, so a unit is read as one forward stream (with
        the high bits in a second region 2 KiB on, one core streamed Q6_K from DRAM at half speed).
  Q1_0  (unit 128 values, AVX-512 VNNI only) d[16] | 32 x 8 bytes: mask g, bit 4c + b = code[c][4g + b]
        (the sign bit: +d where set)                                                        16 * 18
  Q2_0  (unit 64 values, AVX-512 VNNI only) d[16] | 16 x (bit 0, bit 1 masks of code group g, as Q1_0's)
                                                                                            16 * 18
Included once by lc_kernels.c (plain C: packing runs at load, unpacking only for embedding lookups). */

/* LC_X16, the type flag of a matrix in this layout, is in lc_kernels.h. */

/* What the x16 kernels read of a step's quantized activations (lc_x16_summaries makes them). */
typedef struct {
    const int8_t *xq;    /* [t, k] codes */
    const int32_t *ns16; /* [t, k / 16] minus each 16 values' code sum */
    const int32_t *ns32; /* [t, k / 32] minus each 32 values' code sum */
    const float *dx32;   /* [t, k / 32] activation scale */
    const float *fs32;   /* [t, k / 32] scale * code sum */
} lc_x16_sums;

/* One unit of each type (16 columns x 32 or 256 values), as the table above draws it: the kernels read
   these fields at the offsets below, and the sizes are asserted against the GGUF bytes they hold. */
typedef uint8_t lc_x16_chunk[64]; /* 4 codes (or bit fields) of 16 columns */
typedef struct { uint16_t d[16]; lc_x16_chunk q[4]; } lc_x16_q4_0;
typedef struct { uint16_t d[16], m[16]; lc_x16_chunk q[4]; } lc_x16_q4_1;
typedef struct { uint16_t d[16]; lc_x16_chunk q[4], qh; } lc_x16_q5_0;
typedef struct { uint16_t d[16], m[16]; lc_x16_chunk q[4], qh; } lc_x16_q5_1;
typedef struct { uint16_t d[16]; lc_x16_chunk q[8]; } lc_x16_q8_0;
typedef struct { uint8_t sm[2][16]; lc_x16_chunk q[2]; } lc_x16_q2_32; /* 32 values of Q2_K */
typedef struct { uint16_t d[16], dmin[16]; lc_x16_q2_32 sub[8]; } lc_x16_q2_k;
typedef struct { int8_t sc[2][16]; lc_x16_chunk ql[2], qh; } lc_x16_q3_32;
typedef struct { uint16_t d[16]; lc_x16_q3_32 sub[8]; } lc_x16_q3_k;
typedef struct { uint16_t d[16], dmin[16]; uint8_t sc[8][16], min[8][16]; lc_x16_chunk q[8][4]; } lc_x16_q4_k;
typedef struct { lc_x16_chunk ql[4], qh; } lc_x16_q5_32;
typedef struct { uint16_t d[16], dmin[16]; uint8_t sc[8][16], min[8][16]; lc_x16_q5_32 sub[8]; } lc_x16_q5_k;
typedef struct { int8_t sc[2][16]; lc_x16_chunk ql[4], qh[2]; } lc_x16_q6_32;
typedef struct { uint16_t d[16]; lc_x16_q6_32 sub[8]; } lc_x16_q6_k;

/* The file's bytes per block times 16, except Q3_K, Q4_K and Q5_K (their 6-bit scales spread to bytes). */
_Static_assert(sizeof(lc_x16_q4_0) == 16 * 18, "Q4_0 unit");
_Static_assert(sizeof(lc_x16_q4_1) == 16 * 20, "Q4_1 unit");
_Static_assert(sizeof(lc_x16_q5_0) == 16 * 22, "Q5_0 unit");
_Static_assert(sizeof(lc_x16_q5_1) == 16 * 24, "Q5_1 unit");
_Static_assert(sizeof(lc_x16_q8_0) == 16 * 34, "Q8_0 unit");
_Static_assert(sizeof(lc_x16_q2_k) == 16 * 84, "Q2_K unit");
_Static_assert(sizeof(lc_x16_q3_k) == 16 * 114, "Q3_K unit: 110 bytes per 256 values in the file");
_Static_assert(sizeof(lc_x16_q4_k) == 16 * 148, "Q4_K unit: 144 bytes per 256 values in the file");
_Static_assert(sizeof(lc_x16_q5_k) == 16 * 180, "Q5_K unit: 176 bytes per 256 values in the file");
_Static_assert(sizeof(lc_x16_q6_k) == 16 * 210, "Q6_K unit");

/* Byte offsets in a unit (the kernels add them to a unit's address); j: 32 values (0..7) of a K-quant. */
#define LC_X16_AT(unit, field) ((int64_t)offsetof(unit, field))
#define LC_X16_SUB(unit, part, j, field) (LC_X16_AT(unit, sub) + (int64_t)sizeof(part) * (j) + LC_X16_AT(part, field))
/* Where a 32-value unit's nibble codes start (Q4_0, Q4_1, Q5_0, Q5_1); Q5_0/Q5_1's fifth bits follow them. */
#define LC_X16_LEGACY_Q(type) ((type) == LC_Q4_1 || (type) == LC_Q5_1 ? LC_X16_AT(lc_x16_q4_1, q) : LC_X16_AT(lc_x16_q4_0, q))
#define LC_X16_Q5_QL(j) LC_X16_SUB(lc_x16_q5_k, lc_x16_q5_32, j, ql)
#define LC_X16_Q5_QH(j) LC_X16_SUB(lc_x16_q5_k, lc_x16_q5_32, j, qh)
#define LC_X16_Q2_SM(j) LC_X16_SUB(lc_x16_q2_k, lc_x16_q2_32, j, sm)
#define LC_X16_Q2_Q(j) LC_X16_SUB(lc_x16_q2_k, lc_x16_q2_32, j, q)
#define LC_X16_Q3_SC(j) LC_X16_SUB(lc_x16_q3_k, lc_x16_q3_32, j, sc)
#define LC_X16_Q3_QL(j) LC_X16_SUB(lc_x16_q3_k, lc_x16_q3_32, j, ql)
#define LC_X16_Q3_QH(j) LC_X16_SUB(lc_x16_q3_k, lc_x16_q3_32, j, qh)
#define LC_X16_Q6_SC(j) LC_X16_SUB(lc_x16_q6_k, lc_x16_q6_32, j, sc)
#define LC_X16_Q6_QL(j) LC_X16_SUB(lc_x16_q6_k, lc_x16_q6_32, j, ql)
#define LC_X16_Q6_QH(j) LC_X16_SUB(lc_x16_q6_k, lc_x16_q6_32, j, qh)

static inline int lc_x16_type_ok(int type) {
    return type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q5_0 || type == LC_Q5_1 || type == LC_Q8_0 ||
           type == LC_Q2_K || type == LC_Q3_K || type == LC_Q4_K || type == LC_Q5_K || type == LC_Q6_K ||
           type == LC_Q1_0 || type == LC_Q2_0; /* these two: AVX-512 VNNI only (lc_lowbit_x16.h; lc_x16_supported) */
}

/* Types whose codes many-row steps expand to bytes once per panel rather than on every pass over a few
   activation rows: the 5- and 6-bit ones, whose extraction costs about as much as their dot products
   (for 4-bit codes, expanding was no faster on AVX2 and AVX-512 alike); Q3_K's 3-bit codes are two fields. */
static inline int lc_x16_expands(int type) {
    return type == LC_Q5_0 || type == LC_Q5_1 || type == LC_Q3_K || type == LC_Q5_K || type == LC_Q6_K;
}

/* The calling thread's buffer for codes expanded to bytes (`need` bytes, lc_grow), or NULL when out of
   memory (the kernels then extract codes as they go). */
LC_SCRATCH(lc_x16_xc);

static inline uint8_t *lc_x16_expand_buffer(size_t need) { return (uint8_t *)lc_grow(&lc_x16_xc, &lc_x16_xc_size, need); }

static inline int64_t lc_x16_unit(int type) {
    return type == LC_Q1_0 ? 128 : type == LC_Q2_0 ? 64 : type >= LC_Q2_K ? 256 : 32;
}

static inline int64_t lc_x16_unit_bytes(int type) {
    switch (type) {
    case LC_Q4_0: return sizeof(lc_x16_q4_0);
    case LC_Q4_1: return sizeof(lc_x16_q4_1);
    case LC_Q5_0: return sizeof(lc_x16_q5_0);
    case LC_Q5_1: return sizeof(lc_x16_q5_1);
    case LC_Q8_0: return sizeof(lc_x16_q8_0);
    case LC_Q2_K: return sizeof(lc_x16_q2_k);
    case LC_Q3_K: return sizeof(lc_x16_q3_k);
    case LC_Q4_K: return sizeof(lc_x16_q4_k);
    case LC_Q5_K: return sizeof(lc_x16_q5_k);
    case LC_Q1_0:
    case LC_Q2_0: return 16 * 18; /* d[16], 32 masks of 64 bits (lc_lowbit_x16.h) */
    default: return sizeof(lc_x16_q6_k);
    }
}

static inline int64_t lc_x16_panel_bytes(int type, int64_t k) { return k / lc_x16_unit(type) * lc_x16_unit_bytes(type); }

/* Where code kk (0..31) of column c sits in nibble codes: its byte, and 4 if in the high nibble. */
static inline int64_t lc_x16_nib(int c, int kk, int *shift) {
    int g = kk / 4;
    *shift = (g & 1) * 4;
    return 64 * (g / 2) + 4 * c + kk % 4;
}

static void lc_x16_get_nibbles(const uint8_t *q, int c, uint8_t *codes) {
    for (int kk = 0; kk < 32; kk++) {
        int sh;
        int64_t at = lc_x16_nib(c, kk, &sh);
        codes[kk] = (q[at] >> sh) & 15;
    }
}

/* Column c's bits of 32 values in one chunk (lc_x16_put_bits) added to codes at bit `bit`. */
static void lc_x16_get_bits(const uint8_t *chunk, int c, uint8_t *codes, int bit) {
    for (int kk = 0; kk < 32; kk++) codes[kk] |= (uint8_t)(((chunk[4 * c + kk % 4] >> (kk / 4)) & 1) << bit);
}

/* Column c's 2-bit fields of 32 values in two chunks (lc_x16_put_pairs) added to codes at bit `shift`. */
static void lc_x16_get_pairs(const uint8_t *chunks, int c, uint8_t *codes, int shift) {
    for (int kk = 0; kk < 32; kk++) {
        int g = kk / 4;
        codes[kk] |= (uint8_t)(((chunks[64 * (g / 4) + 4 * c + kk % 4] >> (2 * (g % 4))) & 3) << shift);
    }
}

/* Nibble codes of 32 values (from column c's codes[c][x0..x0 + 32), low 4 bits) into q. */
static void lc_x16_put_nibbles(uint8_t *q, const uint8_t codes[16][256], int x0) {
    for (int j = 0; j < 4; j++)
        for (int c = 0; c < 16; c++)
            for (int b = 0; b < 4; b++)
                q[64 * j + 4 * c + b] = (uint8_t)((codes[c][x0 + 8 * j + b] & 15) | (codes[c][x0 + 8 * j + 4 + b] & 15) << 4);
}

/* Bit `bit` of 32 codes (column c's codes[c][x0..x0 + 32)) into one chunk: byte 4c + b, bit g = that
   bit of code[c][4g + b] (Q5's fifth bits, Q3_K's third). */
static void lc_x16_put_bits(uint8_t *chunk, const uint8_t codes[16][256], int x0, int bit) {
    for (int c = 0; c < 16; c++)
        for (int b = 0; b < 4; b++) {
            uint8_t bits = 0;
            for (int g = 0; g < 8; g++) bits |= (uint8_t)(((codes[c][x0 + 4 * g + b] >> bit) & 1) << g);
            chunk[4 * c + b] = bits;
        }
}

/* Bits shift..shift + 1 of 32 codes into two chunks: byte 4c + b of chunk h, bits 2g..2g + 1 = those of
   code[c][x0 + 16h + 4g + b] (Q6_K's high bits, Q3_K's low). */
static void lc_x16_put_pairs(uint8_t *chunks, const uint8_t codes[16][256], int x0, int shift) {
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < 16; c++)
            for (int b = 0; b < 4; b++) {
                const uint8_t *cc = codes[c] + x0 + 16 * h + b;
                uint8_t v = 0;
                for (int g = 0; g < 4; g++) v |= (uint8_t)(((cc[4 * g] >> shift) & 3) << (2 * g));
                chunks[64 * h + 4 * c + b] = v;
            }
}

/* Column c's header fields of one unit (scales as the layout stores them) from its GGUF block(s) `b`,
   and its codes into codes[c] (lc_decode.h's decoders: Q8_0's already + 128, Q2_K's 0..3, Q3_K's 0..7,
   the 5-bit types' 0..31, Q6_K's 0..63). */
static void lc_x16_unit_column(int type, const uint8_t *b, uint8_t *u, int c, uint8_t *codes) {
    float ls[8], mc[2];
    if (type < LC_Q2_K || type == LC_Q4_K || type == LC_Q5_K) memcpy(u + 2 * c, b, 2); /* d first in the block */
    if (type == LC_Q4_1 || type == LC_Q5_1 || type == LC_Q4_K || type == LC_Q5_K)
        memcpy(u + 32 + 2 * c, b + 2, 2); /* m / dmin next */
    switch (type) {
    case LC_Q1_0: /* d, and each value's sign bit as its code */
        memcpy(u + 2 * c, b, 2);
        for (int j = 0; j < 128; j++) codes[j] = (b[2 + j / 8] >> (j % 8)) & 1;
        return;
    case LC_Q2_0: /* d, and each value's 2-bit code q (value q - 1) */
        memcpy(u + 2 * c, b, 2);
        for (int j = 0; j < 64; j++) codes[j] = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
        return;
    case LC_Q4_0: dec_q4_0_portable(b, codes, ls, mc); return;
    case LC_Q4_1: dec_q4_1_portable(b, codes, ls, mc); return;
    case LC_Q5_0: dec_q5_0_portable(b, codes, ls, mc); return;
    case LC_Q5_1: dec_q5_1_portable(b, codes, ls, mc); return;
    case LC_Q8_0: dec_q8_0_portable(b, codes, ls, mc); return;
    case LC_Q4_K:
    case LC_Q5_K:
        for (int s = 0; s < 8; s++) {
            int sc, m;
            lc_scale_min_k4(s, b + 4, &sc, &m);
            u[64 + 16 * s + c] = (uint8_t)sc;
            u[192 + 16 * s + c] = (uint8_t)m;
            if (type == LC_Q4_K) dec_q4_k_portable(b, s, codes + 32 * s, ls, mc);
            else dec_q5_k_portable(b, s, codes + 32 * s, ls, mc);
        }
        return;
    case LC_Q2_K:
        memcpy(u + 2 * c, b + 80, 2);
        memcpy(u + 32 + 2 * c, b + 82, 2);
        for (int h = 0; h < 16; h++) u[LC_X16_Q2_SM(h / 2) + 16 * (h % 2) + c] = b[h];
        for (int s = 0; s < 8; s++) dec_q2_k_portable(b, s, codes + 32 * s, ls, mc);
        return;
    case LC_Q3_K:
        memcpy(u + 2 * c, b + 108, 2);
        for (int h = 0; h < 16; h++) u[LC_X16_Q3_SC(h / 2) + 16 * (h % 2) + c] = (uint8_t)(int8_t)q3k_scale_portable(b + 96, h);
        for (int s = 0; s < 8; s++) dec_q3_k_portable(b, s, codes + 32 * s, ls, mc);
        return;
    default: /* LC_Q6_K */
        memcpy(u + 2 * c, b + 208, 2);
        for (int h = 0; h < 16; h++) u[LC_X16_Q6_SC(h / 2) + 16 * (h % 2) + c] = b[192 + h];
        for (int s = 0; s < 8; s++) dec_q6_k_portable(b, s, codes + 32 * s, ls, mc);
        return;
    }
}

/* Panel `p` (out, zeroed) from the GGUF rows 16p.. of w: per unit, every column's codes decoded into
   one 16 x unit table, then written chunk by chunk (one pass over the output bytes). */
static void lc_x16_pack_panel(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, int64_t p,
                              uint8_t *out) {
    int64_t unit = lc_x16_unit(type), ub = lc_x16_unit_bytes(type);
    int64_t bb = lc_block_bytes(type) * (unit / 32) / lc_block_subs(type); /* GGUF bytes per unit */
    uint8_t codes[16][256];
    for (int64_t s = 0; s < k / unit; s++) {
        uint8_t *u = out + s * ub;
        memset(codes, type == LC_Q8_0 ? 128 : 0, sizeof(codes)); /* padding columns: weight 0 */
        for (int c = 0; c < 16 && 16 * p + c < n; c++)
            lc_x16_unit_column(type, w + (16 * p + c) * row_bytes + s * bb, u, c, codes[c]);
        switch (type) {
        case LC_Q1_0: /* mask g: bit 4c + b = column c's value 4g + b */
            for (int g = 0; g < 32; g++) {
                uint64_t m = 0;
                for (int c = 0; c < 16; c++)
                    for (int b = 0; b < 4; b++) m |= (uint64_t)(codes[c][4 * g + b] & 1) << (4 * c + b);
                memcpy(u + 32 + 8 * g, &m, 8);
            }
            break;
        case LC_Q2_0: /* per code group g two masks: bit 0, then bit 1 of each code */
            for (int g = 0; g < 16; g++)
                for (int bit = 0; bit < 2; bit++) {
                    uint64_t m = 0;
                    for (int c = 0; c < 16; c++)
                        for (int b = 0; b < 4; b++) m |= (uint64_t)((codes[c][4 * g + b] >> bit) & 1) << (4 * c + b);
                    memcpy(u + 32 + 16 * g + 8 * bit, &m, 8);
                }
            break;
        case LC_Q4_0:
        case LC_Q4_1: lc_x16_put_nibbles(u + LC_X16_LEGACY_Q(type), codes, 0); break;
        case LC_Q5_0:
        case LC_Q5_1: /* the low 4 bits as nibbles, then the fifth bits */
            lc_x16_put_nibbles(u + LC_X16_LEGACY_Q(type), codes, 0);
            lc_x16_put_bits(u + LC_X16_LEGACY_Q(type) + 256, codes, 0, 4);
            break;
        case LC_Q8_0:
            for (int g = 0; g < 8; g++)
                for (int c = 0; c < 16; c++) memcpy(u + 32 + 64 * g + 4 * c, &codes[c][4 * g], 4);
            break;
        case LC_Q4_K:
            for (int j = 0; j < 8; j++) lc_x16_put_nibbles(u + 320 + 256 * j, codes, 32 * j);
            break;
        case LC_Q5_K: /* the low 4 bits as nibbles, the fifth bits one per group */
            for (int j = 0; j < 8; j++) {
                lc_x16_put_nibbles(u + LC_X16_Q5_QL(j), codes, 32 * j);
                lc_x16_put_bits(u + LC_X16_Q5_QH(j), codes, 32 * j, 4);
            }
            break;
        case LC_Q2_K:
            for (int j = 0; j < 8; j++) lc_x16_put_pairs(u + LC_X16_Q2_Q(j), codes, 32 * j, 0);
            break;
        case LC_Q3_K: /* the low 2 bits in 2-bit fields, the third one per group */
            for (int j = 0; j < 8; j++) {
                lc_x16_put_pairs(u + LC_X16_Q3_QL(j), codes, 32 * j, 0);
                lc_x16_put_bits(u + LC_X16_Q3_QH(j), codes, 32 * j, 2);
            }
            break;
        default: /* LC_Q6_K: low 4 bits as nibbles, the high 2 in 2-bit fields */
            for (int j = 0; j < 8; j++) {
                lc_x16_put_nibbles(u + LC_X16_Q6_QL(j), codes, 32 * j);
                lc_x16_put_pairs(u + LC_X16_Q6_QH(j), codes, 32 * j, 4);
            }
            break;
        }
    }
}

/* out (zeroed here) = the n GGUF rows of w (row_bytes apart) in panels; panels split over threads. */
static void lc_x16_pack(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, uint8_t *out, int nth) {
    int64_t pb = lc_x16_panel_bytes(type, k), panels = (n + 15) / 16;
    memset(out, 0, (size_t)(panels * pb));
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static)
#endif
    for (int64_t p = 0; p < panels; p++) lc_x16_pack_panel(type, w, n, k, row_bytes, p, out + p * pb);
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
        case LC_Q1_0: /* +d where the bit is set, -d where clear: lc_lb_dec's d * (+-1) */
            for (int j = 0; j < 128; j++) {
                uint64_t m;
                memcpy(&m, u + 32 + 8 * (j / 4), 8);
                o[j] = d * (float)((m >> (4 * c + j % 4)) & 1 ? 1 : -1);
            }
            break;
        case LC_Q2_0: /* lc_lb_dec's d * (q - 1) */
            for (int j = 0; j < 64; j++) {
                uint64_t m0, m1;
                memcpy(&m0, u + 32 + 16 * (j / 4), 8);
                memcpy(&m1, u + 40 + 16 * (j / 4), 8);
                const int at = 4 * c + j % 4, q = (int)((m0 >> at) & 1) | (int)((m1 >> at) & 1) << 1;
                o[j] = d * (float)(q - 1);
            }
            break;
        case LC_Q4_0:
        case LC_Q4_1:
        case LC_Q5_0:
        case LC_Q5_1: { /* offsets: -8d, m, -16d, m */
            const uint8_t *q = u + LC_X16_LEGACY_Q(type);
            float m = type == LC_Q4_1 || type == LC_Q5_1 ? lc_f16(lc_u16(u + 32 + 2 * c)) : type == LC_Q4_0 ? -8.0f * d : -16.0f * d;
            lc_x16_get_nibbles(q, c, codes);
            if (type == LC_Q5_0 || type == LC_Q5_1) lc_x16_get_bits(q + 256, c, codes, 4);
            for (int kk = 0; kk < 32; kk++) o[kk] = d * (float)codes[kk] + m;
            break;
        }
        case LC_Q8_0:
            for (int kk = 0; kk < 32; kk++) o[kk] = d * (float)u[32 + 64 * (kk / 4) + 4 * c + kk % 4] + -128.0f * d;
            break;
        case LC_Q4_K:
        case LC_Q5_K: {
            float dmin = lc_f16(lc_u16(u + 32 + 2 * c));
            for (int j = 0; j < 8; j++) {
                float sc = d * (float)u[64 + 16 * j + c], m = dmin * (float)u[192 + 16 * j + c];
                lc_x16_get_nibbles(u + (type == LC_Q4_K ? 320 + 256 * j : LC_X16_Q5_QL(j)), c, codes);
                if (type == LC_Q5_K) lc_x16_get_bits(u + LC_X16_Q5_QH(j), c, codes, 4);
                for (int kk = 0; kk < 32; kk++) o[32 * j + kk] = sc * (float)codes[kk] - m;
            }
            break;
        }
        case LC_Q2_K: { /* a scale and a min per 16 values */
            float dmin = lc_f16(lc_u16(u + 32 + 2 * c));
            for (int j = 0; j < 8; j++) {
                memset(codes, 0, sizeof(codes));
                lc_x16_get_pairs(u + LC_X16_Q2_Q(j), c, codes, 0);
                for (int kk = 0; kk < 32; kk++) {
                    uint8_t sm = u[LC_X16_Q2_SM(j) + 16 * (kk / 16) + c];
                    o[32 * j + kk] = d * (float)(sm & 15) * (float)codes[kk] + -dmin * (float)(sm >> 4);
                }
            }
            break;
        }
        default: /* LC_Q3_K, LC_Q6_K: a scale per 16 values, offsets -4 and -32 x scale */
            for (int j = 0; j < 8; j++) {
                const int q3 = type == LC_Q3_K;
                if (q3) {
                    memset(codes, 0, sizeof(codes));
                    lc_x16_get_pairs(u + LC_X16_Q3_QL(j), c, codes, 0);
                    lc_x16_get_bits(u + LC_X16_Q3_QH(j), c, codes, 2);
                } else {
                    lc_x16_get_nibbles(u + LC_X16_Q6_QL(j), c, codes);
                    lc_x16_get_pairs(u + LC_X16_Q6_QH(j), c, codes, 4);
                }
                for (int kk = 0; kk < 32; kk++) {
                    float sc = d * (float)(int8_t)u[(q3 ? LC_X16_Q3_SC(j) : LC_X16_Q6_SC(j)) + 16 * (kk / 16) + c];
                    o[32 * j + kk] = sc * (float)codes[kk] + (q3 ? -4.0f : -32.0f) * sc;
                }
            }
            break;
        }
    }
}
