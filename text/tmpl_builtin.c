/* tmpl_builtin: prompt formats the user can ask for by name (--chat-template NAME) when a
 * model ships no usable template. Written from the published formats; each accepts string
 * content or a list of {type: text, text} parts. */
#include <string.h>

#include "tmpl_internal.h"

#define TEXT_MACRO                                                                                     \
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c is iterable -%}{%- for p in c -%}"   \
    "{%- if p is mapping and p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}{%- endfor -%}"        \
    "{%- elif c is not none -%}{{ c }}{%- endif -%}{%- endmacro -%}\n"

#define ALTERNATE_CHECK                                                                                \
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"                                 \
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"     \
    "{%- endif -%}\n"

static const char CHATML[] = TEXT_MACRO
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ text(message['content']) ~ '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

static const char LLAMA3[] = TEXT_MACRO
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ text(message['content']) | trim ~ '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n";

static const char LLAMA2[] = TEXT_MACRO
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set system = text(messages[0]['content']) | trim -%}{%- set msgs = messages[1:] -%}\n"
    "{%- else -%}{%- set system = '' -%}{%- set msgs = messages -%}{%- endif -%}\n"
    "{%- for message in msgs -%}\n" ALTERNATE_CHECK
    "{%- if message['role'] == 'user' -%}\n"
    "{%- set content = text(message['content']) | trim -%}\n"
    "{%- if loop.first and system -%}{%- set content = '<<SYS>>\\n' ~ system ~ '\\n<</SYS>>\\n\\n' ~ content -%}{%- endif -%}\n"
    "{{- bos_token ~ '[INST] ' ~ content ~ ' [/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- ' ' ~ text(message['content']) | trim ~ ' ' ~ eos_token -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

static const char MISTRAL[] = TEXT_MACRO
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set system = text(messages[0]['content']) | trim -%}{%- set msgs = messages[1:] -%}\n"
    "{%- else -%}{%- set system = '' -%}{%- set msgs = messages -%}{%- endif -%}\n"
    "{{- bos_token -}}\n"
    "{%- for message in msgs -%}\n" ALTERNATE_CHECK
    "{%- if message['role'] == 'user' -%}\n"
    "{%- set content = text(message['content']) | trim -%}\n"
    "{%- if loop.first and system -%}{%- set content = system ~ '\\n\\n' ~ content -%}{%- endif -%}\n"
    "{{- '[INST] ' ~ content ~ ' [/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- text(message['content']) | trim ~ eos_token -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

static const char GEMMA[] = TEXT_MACRO
    "{{- bos_token -}}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set first_user_prefix = text(messages[0]['content']) ~ '\\n\\n' -%}{%- set msgs = messages[1:] -%}\n"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set msgs = messages -%}{%- endif -%}\n"
    "{%- for message in msgs -%}\n" ALTERNATE_CHECK
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "{{- '<start_of_turn>' ~ role ~ '\\n' ~ (first_user_prefix if loop.first else '') ~ text(message['content']) | trim ~ '<end_of_turn>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n";

static const char PHI3[] = TEXT_MACRO
    "{%- for message in messages -%}\n"
    "{{- '<|' ~ message['role'] ~ '|>\\n' ~ text(message['content']) ~ '<|end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}\n";

static const struct { const char *name, *src; } builtins[] = {
    {"chatml", CHATML}, {"llama3", LLAMA3}, {"llama2", LLAMA2}, {"mistral", MISTRAL}, {"gemma", GEMMA}, {"phi3", PHI3},
};

const char *tmpl_builtin(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name)) return builtins[i].src;
    return NULL;
}

const char *tmpl_builtin_names(void) { return "chatml, llama3, llama2, mistral, gemma, phi3"; }
