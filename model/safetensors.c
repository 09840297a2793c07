/* safetensors: Hugging Face checkpoints (being written in this session). */
#include "model.h"
#include "../common/cm_err.h"
#include <stdio.h>

int mdl__load_safetensors(const char *path, mdl_model **out, char *err, size_t errlen) {
    *out = NULL;
    snprintf(err, errlen, "%s: safetensors loading is not available in this build", path);
    return CM_EUNSUPPORTED;
}

void mdl__st_free(void *st) { (void)st; }
