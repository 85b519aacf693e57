// Token datasets (`nt.data`): llm.c's shard format, the GPT-2 tokenizer CLI, and the resumable
// distributed loader.
export { writeTokenShard, TokenShard, TOKEN_SHARD_MAGIC, TOKEN_SHARD_VERSION } from './shards.js';
export { TokenLoader, permutation, type TokenLoaderOptions, type LoaderState, type TokenBatch } from './loader.js';
export { tokenize, listInputs, gpt2Tokenizer, GPT2_EOT, type TokenizeOptions, type TokenizeSummary } from './tokenize.js';
