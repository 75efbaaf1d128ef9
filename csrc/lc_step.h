/* A decode step's decoder layers in one call: lc_kernels.c includes this file once, at its end, after the
exported functions it strings together (lc_rms_norm, lc_linear, lc_decode_rope_attention, lc_swiglu).

At a small model's decode step the Python around each layer's six kernel calls (tensor allocations,
ctypes argument conversion, dispatch) cost more than the kernels: SmolLM2-135M's 30 layers spent about
half of each token there. Here the same kernels run in the same order on the same bfloat16 or float32
intermediates, so the result is the Python path's to the last bit (tests/backends/test_decode_step.py).

The layer is the Llama layout (models/llama.py's LlamaLayer): x + o(attention(rope(q, k), v)) over
RMSNorm(x), then x + down(silu(gate) * up) over RMSNorm(x), with optional q|k|v and o biases. */

/* lc_step_matrix and lc_step_layer are in lc_kernels.h (localchat/kernels/step.py mirrors them). */

/* The intermediates of one step, per thread, grown on demand. */
LC_SCRATCH(lc_step_buf);

static int64_t lc_step_rows(const lc_step_matrix *m) {
    if (m->nseg < 1 || m->nseg > LC_STEP_MAX_SEG) return -1;
    int64_t n = 0;
    for (int i = 0; i < m->nseg; i++) n += m->rows[i];
    return n;
}

static int lc_step_linear(int isa, const void *x, int bf16, int64_t t, int64_t k, const lc_step_matrix *m,
                          int precise, void *out, int64_t n, int nth) {
    return lc_linear(isa, x, bf16, t, k, m->nseg, m->types, m->ptrs, m->rows, m->row_bytes, precise, out, bf16, n,
                     nth);
}

/* out [rows, n] = a [rows, n] + b (one row [n] when b_stride is 0, else [rows, n]), rounded as the torch
   path's `a + b` tensor is; out may be a. The dtype branch sits outside the loops, so the compiler
   vectorizes them (the per-element branch of lc_load / lc_store kept them scalar). */
static void lc_step_add(void *out, const void *a, int bf16, int64_t rows, int64_t n, const void *b, int64_t b_stride) {
    for (int64_t r = 0; r < rows; r++) {
        if (bf16) {
            uint16_t *o = (uint16_t *)out + r * n;
            const uint16_t *ar = (const uint16_t *)a + r * n, *br = (const uint16_t *)b + r * b_stride;
            for (int64_t j = 0; j < n; j++) o[j] = lc_to_bf16(lc_bf16(ar[j]) + lc_bf16(br[j]));
        } else {
            float *o = (float *)out + r * n;
            const float *ar = (const float *)a + r * n, *br = (const float *)b + r * b_stride;
            for (int64_t j = 0; j < n; j++) o[j] = ar[j] + br[j];
        }
    }
}

/* x [rows, hidden] (float32, or bfloat16 if bf16; updated in place) through `nlayers` layers, one decode
   token per row: caches[i] is layer i's cache [2, kv_heads, num_slots, d] of cache_type (float32 or
   bfloat16), cos/sin [rows, d] in the compute type, slots [rows] where this step's k and v go, tables
   [rows, max_blocks] and seq_lens [rows] as lc_decode_attention takes them. inter: the MLP's width;
   window > 0: attend to the last `window` positions only. naux > 0: the input of layer aux_layers[a]
   (nlayers: the last layer's output) goes to columns [a * hidden, (a + 1) * hidden) of aux [rows,
   naux * hidden], as torch.cat of those states would lay them out (an EAGLE-3 head reads them). Returns
   LC_EINVAL on a bad shape or argument, LC_ENOMEM when a buffer cannot grow (x may be partly updated
   then). */

/* aux's columns for every aux layer `layer` names: a copy of x [rows, hidden] (the layer's input). */
static void lc_step_keep(const lc_step_args *a, int layer, const void *x, size_t item) {
    size_t width = (size_t)a->hidden * item, stride = (size_t)a->naux * width;
    for (int j = 0; j < a->naux; j++) {
        if (a->aux_layers[j] != layer) continue;
        char *out = (char *)(uintptr_t)a->aux + (size_t)j * width;
        for (int64_t r = 0; r < a->rows; r++)
            memcpy(out + (size_t)r * stride, (const char *)x + (size_t)r * width, width);
    }
}

LC_EXPORT int lc_decode_layers(const lc_step_args *a) {
    if (!a) return -1;
    const int isa = a->isa, nlayers = a->nlayers, cache_type = a->cache_type, bf16 = a->bf16, precise = a->precise,
              nth = a->nth;
    const int64_t num_slots = a->num_slots, rows = a->rows, hidden = a->hidden, heads = a->heads,
                  kv_heads = a->kv_heads, d = a->d, inter = a->inter, max_blocks = a->max_blocks,
                  block_size = a->block_size, window = a->window;
    const float eps = a->eps, scale = a->scale;
    const lc_step_layer *layers = (const lc_step_layer *)(uintptr_t)a->layers;
    const uint64_t *caches = (const uint64_t *)(uintptr_t)a->caches;
    void *x = (void *)(uintptr_t)a->x;
    const void *cos = (const void *)(uintptr_t)a->cos, *sin = (const void *)(uintptr_t)a->sin;
    const int64_t *slots = (const int64_t *)(uintptr_t)a->slots, *tables = (const int64_t *)(uintptr_t)a->tables,
                  *seq_lens = (const int64_t *)(uintptr_t)a->seq_lens;
    if (!layers || !caches || !x || a->naux < 0 || a->naux > LC_STEP_MAX_AUX || (a->naux && !a->aux)) return -1;
    for (int j = 0; j < a->naux; j++)
        if (a->aux_layers[j] < 0 || a->aux_layers[j] > nlayers) return -1;
    int64_t nqkv = (heads + 2 * kv_heads) * d, natt = heads * d;
    if (nlayers < 0 || rows < 1 || hidden < 1 || kv_heads < 1 || d < 1 || inter < 1) return -1;
    for (int i = 0; i < nlayers; i++) {
        const lc_step_layer *L = &layers[i];
        if (lc_step_rows(&L->qkv) != nqkv || lc_step_rows(&L->o) != hidden || lc_step_rows(&L->gate_up) != 2 * inter ||
            lc_step_rows(&L->down) != hidden || !L->attn_norm || !L->mlp_norm || !caches[i])
            return -1;
    }
    /* normed | qkv | attention | residual sum | gate_up | activation | down, each [rows, width] */
    int64_t widths = hidden + nqkv + natt + hidden + 2 * inter + inter + hidden;
    size_t item = bf16 ? 2 : 4, need = (size_t)(rows * widths) * item + 7 * 64;
    if (!lc_grow(&lc_step_buf, &lc_step_buf_size, need)) return LC_ENOMEM;
    char *at = (char *)lc_step_buf;
    void *bufs[7];
    const int64_t w7[7] = {hidden, nqkv, natt, hidden, 2 * inter, inter, hidden};
    for (int b = 0; b < 7; b++) { /* each on its own cache line */
        bufs[b] = at;
        at += ((size_t)(rows * w7[b]) * item + 63) & ~(size_t)63;
    }
    void *normed = bufs[0], *qkv = bufs[1], *att = bufs[2], *sum = bufs[3], *gu = bufs[4], *act = bufs[5];
    void *down = bufs[6];
    const char *v = (const char *)qkv + (size_t)((heads + kv_heads) * d) * item;
    for (int i = 0; i < nlayers; i++) {
        const lc_step_layer *L = &layers[i];
        if (a->naux) lc_step_keep(a, i, x, item);
        const void *attn_norm = (const void *)(uintptr_t)L->attn_norm, *mlp_norm = (const void *)(uintptr_t)L->mlp_norm;
        int rc; /* a refused call (LC_EINVAL) or a buffer that could not grow (LC_ENOMEM) stops the step */
        if ((rc = lc_rms_norm(isa, x, NULL, bf16, rows, hidden, attn_norm, eps, normed, nth)) ||
            (rc = lc_step_linear(isa, normed, bf16, rows, hidden, &L->qkv, precise, qkv, nqkv, nth)))
            return rc;
        if (L->qkv_bias) lc_step_add(qkv, qkv, bf16, rows, nqkv, (const void *)(uintptr_t)L->qkv_bias, 0);
        if ((rc = lc_decode_rope_attention(isa, qkv, nqkv, v, nqkv, bf16, rows, heads, kv_heads, d, cos, sin, slots,
                                           (void *)(uintptr_t)caches[i], cache_type, num_slots, tables, max_blocks,
                                           seq_lens, block_size, scale, window, 0.0f, att, nth)) ||
            (rc = lc_step_linear(isa, att, bf16, rows, natt, &L->o, precise, sum, hidden, nth)))
            return rc;
        if (L->o_bias) lc_step_add(sum, sum, bf16, rows, hidden, (const void *)(uintptr_t)L->o_bias, 0);
        /* sum = x + o(...) (the residual), normed = RMSNorm(sum) */
        if ((rc = lc_rms_norm(isa, x, sum, bf16, rows, hidden, mlp_norm, eps, normed, nth)) ||
            (rc = lc_step_linear(isa, normed, bf16, rows, hidden, &L->gate_up, precise, gu, 2 * inter, nth)) ||
            (rc = lc_swiglu(isa, gu, bf16, rows, inter, act, nth)) ||
            (rc = lc_step_linear(isa, act, bf16, rows, inter, &L->down, precise, down, hidden, nth)))
            return rc;
        /* x = sum + down, rounded as the torch path's `x + mlp(normed)` */
        lc_step_add(x, sum, bf16, rows, hidden, down, hidden);
    }
    if (a->naux) lc_step_keep(a, nlayers, x, item);
    return 0;
}

LC_EXPORT int64_t lc_step_args_bytes(void) { return (int64_t)sizeof(lc_step_args); }
