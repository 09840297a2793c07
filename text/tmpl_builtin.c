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

/* ChatML with tools as Hermes and Qwen2.5 write them: the functions in the system turn,
 * <tool_call> blocks in assistant turns, tool results as <tool_response> in a user turn. */
static const char CHATML[] = TEXT_MACRO
    "{%- if tools -%}\n"
    "{{- '<|im_start|>system\\n' -}}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}{{- text(messages[0]['content']) ~ '\\n\\n' -}}{%- endif -%}\n"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' -}}\n"
    "{%- for tool in tools -%}{{- '\\n' ~ (tool | tojson) -}}{%- endfor -%}\n"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
    "</tool_call><|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'system' and loop.first and tools -%}\n"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] -%}\n"
    "{{- '<|im_start|>assistant' -}}{%- if message['content'] -%}{{- '\\n' ~ text(message['content']) -}}{%- endif -%}\n"
    "{%- for tc in message['tool_calls'] -%}{%- set f = tc['function'] if tc['function'] is defined else tc -%}\n"
    "{{- '\\n<tool_call>\\n{\"name\": \"' ~ f['name'] ~ '\", \"arguments\": ' ~ (f['arguments'] | tojson) ~ '}\\n</tool_call>' -}}\n"
    "{%- endfor -%}{{- '<|im_end|>\\n' -}}\n"
    "{%- elif message['role'] == 'tool' -%}\n"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}\n"
    "{{- '\\n<tool_response>\\n' ~ text(message['content']) ~ '\\n</tool_response>' -}}\n"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ text(message['content']) ~ '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
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
