// Reference token ids from @lenml/tokenizers (transformers.js) for tests/integration/test_tok_hf.sh.
//   node tok_ref.mjs NPM_CACHE MODEL_DIR TEXTS_FILE plain|special
// TEXTS_FILE holds texts separated by "\n__tok_test__\n"; prints one line of ids per text.
// plain: add_special_tokens false; special: true (BOS/EOS as the tokenizer's post-processor adds).
import { createRequire } from 'module';
import fs from 'fs';
import path from 'path';

const [cache, modelDir, textsFile, mode] = process.argv.slice(2);
const require = createRequire(path.join(cache, 'package.json'));
const { TokenizerLoader } = require('@lenml/tokenizers');
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8')),
});
const texts = fs.readFileSync(textsFile, 'utf8').split('\n__tok_test__\n');
const out = [];
for (const t of texts) {
  const ids = tok.encode(t, { add_special_tokens: mode === 'special' });
  out.push(ids.join(' '));
}
process.stdout.write(out.join('\n') + '\n');
