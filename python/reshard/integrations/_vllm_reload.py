"""Re-processing for the vLLM engine: parameters whose live (kernel) format
is a real transform of the checkpoint format (DeepGEMM's UE8M0
requantization of fp8 block weights, a fused-MoE backend's shuffle or
prepack, MLA's dequantized W_UK_T / W_UV copies) are received in the
checkpoint format and vLLM's own post-load processing is re-run for the
layers that hold them, the way vLLM 0.33's layerwise reload does
(vllm/model_executor/model_loader/reload/layerwise.py,
initialize_layerwise_reload and _layerwise_process):

  stage    per layer: keep its kernel tensors, put it back on the meta
           device in the format vLLM recorded before its first processing
           (record_metadata_for_reloading, called by initialize_model),
           and materialize that format on the layer's device;
  (reshard's plan writes the checkpoint-format parameters)
  process  per layer: vLLM's _layerwise_process (its quant method's
           process_weights_after_loading, then every result copied into the
           kernel tensors, which go back on the layer: their addresses do
           not change, so captured CUDA graphs stay valid); then each MLA
           attention module whose derived tensors come from a re-processed
           kv_b_proj re-derives them (MLAAttention.process_weights_after_
           loading, which copies in place on reload).

Only the affected layers are staged: every other parameter is written in
place as before. The staged bytes are the checkpoint-format size of those
layers on this rank, held from stage to process (one step)."""
import time


def _reload():
    """vLLM's layerwise-reload helpers (vLLM 0.33), or the reason they are
    missing."""
    try:
        from vllm.model_executor.model_loader.reload import layerwise, meta, \
            utils
        return (layerwise.get_layerwise_info, layerwise._layerwise_process,
                layerwise._place_kernel_tensors, meta.restore_layer_on_meta,
                meta.materialize_layer, meta.SKIP_TENSORS,
                utils.get_layer_params_buffers, layerwise.LAYERWISE_INFO), None
    except (ImportError, AttributeError) as e:
        return None, ("this vLLM has no layerwise reload as 0.33 has it "
                      "(vllm/model_executor/model_loader/reload: %s)" % e)


def _nbytes(t):
    return t.numel() * t.element_size()


class Reprocess:
    """The layers of one worker whose parameters reshard receives in the
    checkpoint format and vLLM then re-processes."""

    def __init__(self, layers, rerun, act_dtype):
        """layers: {module: its parameter names reshard writes (local
        names)}; rerun: MLA attention modules to re-derive afterwards;
        act_dtype: the model's dtype (vLLM passes model_config.dtype to
        attention layers' process_weights_after_loading)."""
        self.layers, self.rerun, self.act_dtype = layers, rerun, act_dtype
        self.fns = _reload()[0]
        self.staged_bytes = 0
        self.last_s = 0.0

    @staticmethod
    def check(layers, written, prefix_of, rank):
        """{parameter name: why} for what cannot be re-processed: a layer
        vLLM recorded no checkpoint format for, a loadable tensor of the
        layer reshard does not write (vLLM's processing would read
        uninitialized memory), or a checkpoint-format parameter whose size
        or dtype is not reshard's. ``written``: {full name: (bytes, torch
        dtype)} of this rank's destination buffers; ``prefix_of``: module ->
        its name prefix."""
        fns, why = _reload()
        out = {}
        for layer, names in layers.items():
            prefix = prefix_of[layer]
            if fns is None:
                out[prefix + names[0]] = why
                continue
            info = fns[7].get(layer)
            params, buffers = info.restore_metadata if info else ({}, {})
            skip = fns[5]
            if not params:
                out[prefix + names[0]] = (
                    "vLLM recorded no checkpoint format for this layer "
                    "(record_metadata_for_reloading, run by initialize_model), "
                    "so its post-load processing cannot be re-run")
                continue
            for n, m in list(params.items()) + list(buffers.items()):
                if n in skip:
                    continue
                full = prefix + n
                if full not in written:
                    out[full] = (
                        "re-processing %s's layer needs every tensor vLLM "
                        "loads into it, and reshard does not write this one "
                        "on rank %d" % (prefix + names[0], rank))
                    continue
                nb, dt = written[full]
                if _nbytes(m) != nb or m.dtype != dt:
                    out[full] = (
                        "vLLM loads it as %s %s (%d bytes) before processing, "
                        "reshard's layout says %s (%d bytes) on rank %d" % (
                            tuple(m.shape), m.dtype, _nbytes(m), dt, nb, rank))
        return out

    def stage(self):
        """Every layer into its checkpoint format, materialized (vLLM's
        initialize_layerwise_reload for one layer, then
        materialize_layer). Returns the staged layers."""
        info_of, _, _, restore, materialize, _, params_buffers, _ = self.fns
        t0 = time.perf_counter()
        staged, nbytes = [], 0
        for layer in self.layers:
            info = info_of(layer)
            info.kernel_tensors = params_buffers(layer)
            info.kernel_non_persistent_buffers = set(
                layer._non_persistent_buffers_set)
            restore(layer, info)
            materialize(layer, info)
            staged.append((layer, info))
            nbytes += sum(_nbytes(getattr(layer, n)) for n in self.layers[layer])
        self.staged_bytes = nbytes
        self.last_s = time.perf_counter() - t0
        return staged

    def abandon(self, staged):
        """The kernel tensors back, unprocessed (a failed transfer: the
        layers keep serving the previous weights)."""
        place = self.fns[2]
        for layer, info in staged:
            place(layer, info)
            info.reset()

    def process(self, staged):
        """vLLM's processing of each staged layer, results copied into its
        kernel tensors; then the MLA modules re-derive their copies."""
        process = self.fns[1]
        t0 = time.perf_counter()
        for layer, info in staged:
            process(layer, info)
        for attn in self.rerun:
            attn.process_weights_after_loading(self.act_dtype)
        self.last_s += time.perf_counter() - t0
