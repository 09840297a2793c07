/* gguf_write: streaming writer of GGUF v3 files (v2 on request; the layout is the same).
 *
 * The header (metadata and tensor infos) is assembled in memory; the tensor data is streamed
 * after it, tensor by tensor in the order the infos were added, so files of many GB are written
 * with bounded memory. Padding between tensors and after the header follows general.alignment
 * (a u32 power of two, default 32), exactly as GGUF readers expect it.
 *
 *   gguf_writer *w;
 *   if (gguf_w_create(&w)) die();
 *   gguf_w_set_str(w, "general.architecture", "llama");
 *   gguf_w_set_u32(w, "llama.block_count", 2);
 *   int64_t ne[2] = { 256, 512 };
 *   gguf_w_add_tensor(w, "blk.0.attn_q.weight", DT_Q8_0, 2, ne);
 *   if (gguf_w_begin(w, "out.gguf")) die(gguf_w_errmsg(w));   // header written here
 *   gguf_w_write(w, bytes, n);                                  // any chunking
 *   if (gguf_w_finish(w)) die(gguf_w_errmsg(w));                // checks every byte arrived
 *   gguf_w_destroy(w);
 *
 * Metadata set twice keeps its first position and takes the new value. Values can also be
 * given as a gguf_value tree (the reader's type), which is how nested arrays are written and
 * how metadata is copied from an open file (gguf_w_copy_kv). One writer belongs to one thread.
 */
#ifndef MDL_GGUF_WRITE_H
#define MDL_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf.h"

#define GGUF_W_MAX_NAME 63 /* ggml's limit on tensor names (GGML_MAX_NAME - 1) */

typedef struct gguf_writer gguf_writer;

/* Allocates an empty writer (version 3, alignment 32). Returns 0 or CM_ENOMEM. */
int  gguf_w_create(gguf_writer **out);
/* Frees everything; closes the file if gguf_w_begin opened it and gguf_w_finish did not run
 * (the partial file is left on disk). Accepts NULL. */
void gguf_w_destroy(gguf_writer *w);

/* The last error as one line ("PATH: problem" for I/O); "" when none. Owned by w. */
const char *gguf_w_errmsg(const gguf_writer *w);

/* 2 or 3 (default); before gguf_w_begin. CM_EINVAL otherwise. */
int gguf_w_set_version(gguf_writer *w, uint32_t version);

/* Scalar metadata. Keys are non-empty; CM_EINVAL for an empty key, CM_ESTATE after begin.
 * Setting "general.alignment" (u32, a power of two up to 65536) sets the data alignment;
 * any other type or value for that key is CM_EINVAL. */
int gguf_w_set_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_w_set_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_w_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_w_set_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_w_set_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_w_set_f32(gguf_writer *w, const char *key, float v);
int gguf_w_set_f64(gguf_writer *w, const char *key, double v);
int gguf_w_set_bool(gguf_writer *w, const char *key, int v);
/* NUL-terminated string, or len bytes (may contain NULs) for set_strn. */
int gguf_w_set_str(gguf_writer *w, const char *key, const char *s);
int gguf_w_set_strn(gguf_writer *w, const char *key, const char *s, uint64_t len);
/* Array of n numeric elements of elem_type (packed, host = little-endian layout). */
int gguf_w_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, uint64_t n);
/* Array of n NUL-terminated strings. */
int gguf_w_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Any value, including arrays of arrays, in the reader's representation (for an array:
 * numeric elements in arr.raw, strings in arr.strs, nested arrays in arr.items). The value is
 * serialized immediately; the caller keeps ownership of v. CM_EINVAL for an inconsistent tree
 * or one nested deeper than 8. */
int gguf_w_set_value(gguf_writer *w, const char *key, const gguf_value *v);

/* Copies every key-value of g whose key starts with prefix ("" copies all; "tokenizer." the
 * vocabulary). Returns 0 or an error; *n_copied (may be NULL) gets the count. g stays owned by
 * the caller and may be closed right after. */
int gguf_w_copy_kv(gguf_writer *w, const gguf_ctx *g, const char *prefix, int64_t *n_copied);

/* Declares the next tensor: name (1..63 bytes, unique), type (a known dt_type), 1..4 dims with
 * ne[0] a multiple of the type's block size. Offsets are assigned in order of declaration.
 * CM_EINVAL / CM_EUNSUPPORTED for a bad declaration (message in gguf_w_errmsg). */
int gguf_w_add_tensor(gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne);

/* Bytes of tensor i's data (no padding); 0 when out of range. */
uint64_t gguf_w_tensor_nbytes(const gguf_writer *w, int64_t i);
/* Size of the header with its padding (where tensor data starts) and of the whole file, as
 * things stand (metadata added later changes them). */
uint64_t gguf_w_header_size(const gguf_writer *w);
uint64_t gguf_w_file_size(const gguf_writer *w);

/* Creates path (truncating) and writes the header. After this, metadata and tensors are frozen.
 * Returns 0, CM_EIO (message names the path) or CM_ESTATE if already begun. */
int gguf_w_begin(gguf_writer *w, const char *path);
/* Same onto a caller-owned stream positioned where the file starts (tests use open_memstream);
 * gguf_w_finish flushes but does not close it. */
int gguf_w_begin_fp(gguf_writer *w, FILE *fp);
/* Appends n bytes of tensor data: the bytes continue the current tensor and flow into the next
 * ones in declaration order; padding is inserted automatically. CM_ERANGE when more bytes come
 * than the tensors declared, CM_EIO on a write error, CM_ESTATE before begin. */
int gguf_w_write(gguf_writer *w, const void *data, size_t n);
/* Index of the tensor the next gguf_w_write continues (n_tensors when all are complete). */
int64_t gguf_w_current_tensor(const gguf_writer *w);
/* Checks that every tensor got all its bytes, flushes, and closes the file it opened (fsync is
 * not forced). CM_ESTATE when data is missing, CM_EIO when the flush/close fails. */
int gguf_w_finish(gguf_writer *w);

#endif
