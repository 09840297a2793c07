/* libFuzzer target: arbitrary bytes through the GGUF reader and the model description builder.
 * Every input must end in an error or a valid model; never a crash, leak or out-of-bounds read.
 * The accepted ones are also walked (metadata, tensors, getters) so lazily-read fields are touched. */
#include "model/gguf.h"
#include "model/model.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void walk_value(const gguf_value *v, int depth) {
    if (v->type == GGUF_STRING) {
        if (v->v.s.len) sink += (uint8_t)v->v.s.ptr[v->v.s.len - 1];
        return;
    }
    if (v->type != GGUF_ARRAY) {
        sink += v->v.u;
        return;
    }
    uint64_t n = v->v.arr.n;
    if (v->v.arr.raw && n) {
        double d = gguf_arr_f64(v, 0);
        sink += (uint64_t)gguf_arr_i64(v, n - 1) + (d > -1e18 && d < 1e18 ? (uint64_t)(int64_t)d : 1);
    }
    if (v->v.arr.strs)
        for (uint64_t i = 0; i < n; i++)
            if (v->v.arr.strs[i].len) sink += (uint8_t)v->v.arr.strs[i].ptr[0];
    if (v->v.arr.items && depth < 16)
        for (uint64_t i = 0; i < n; i++) walk_value(&v->v.arr.items[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_ctx *g;
    char err[256];
    if (gguf_open_mem(data, size, &g, err, sizeof err)) return 0;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) walk_value(&gguf_kv_at(g, i)->val, 0);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        /* first and last byte of every tensor must be inside the input */
        if (t->nbytes) sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    uint32_t u;
    float f;
    char *s = NULL;
    if (gguf_get_strdup(g, "general.architecture", &s) == 0) free(s);
    gguf_get_u32(g, "llama.block_count", &u);
    gguf_get_f32(g, "llama.rope.freq_base", &f);
    mdl_model *m;
    if (mdl_from_gguf(g, &m, err, sizeof err) == 0) {
        sink += m->weight_bytes;
        mdl_free(m); /* closes g */
    } else {
        gguf_close(g);
    }
    return 0;
}
