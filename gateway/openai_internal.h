/* openai_internal: what openai.c and openai_resp.c share. Not for use outside them. */
#ifndef GW_OPENAI_INTERNAL_H
#define GW_OPENAI_INTERNAL_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* A JSON string of len bytes (NUL and invalid UTF-8 become U+FFFD). NULL when out of memory. */
cJSON *gw__oai_str(const char *s, size_t len);

#endif
