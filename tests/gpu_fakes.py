"""Stand-ins for the GPU pieces, so their callers' logic is tested on a CPU (helpers of the tests beside this file).

- `FakeNvcomp`: the parts of nvidia.nvcomp's Python API that dctdata.stages.nvcomp_zstd calls, with the arguments and
  behaviour nvidia-nvcomp-cu13 6.0's docstrings describe (`Codec(algorithm=..., bitstream_kind=...)`,
  `as_arrays(buffer, offsets, sizes, cuda_stream=...)`, `codec.decompression_config(srcs)`,
  `codec.decode(srcs, out=..., decompression_config=...)`, `BatchArray.buffer_sizes`,
  `set_device_allocator`), decoding with python-zstandard on CPU tensors and refusing buffers that are not
  8-byte aligned, as nvCOMP's zstd does (nvcomp/zstd.h). `install_fake_nvcomp(monkeypatch)` puts it in place.
- `interpreted_kernel(monkeypatch)`: dctdata's Triton kernel module imported afresh under TRITON_INTERPRET=1, so
  it runs on CPU tensors.
"""

import sys
import types

import torch


class FakeBatch:
    """nvcomp.BatchArray: entries viewing one buffer (torch CPU tensors here), and their sizes."""

    def __init__(self, entries, sizes=None):
        self.entries = entries
        self.sizes = [e.numel() for e in entries] if sizes is None else sizes

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        return self.entries[i][: self.sizes[i]]

    @property
    def buffer_sizes(self):
        return list(self.sizes)


class FakeCodec:
    def __init__(self, owner, **kwargs):
        self.owner, self.kwargs = owner, kwargs
        owner.codecs.append(self)

    def get_required_decompression_alignment(self):
        return 8

    def decompression_config(self, srcs):
        self.owner.configs += 1
        return ("config", tuple(e.numel() for e in srcs.entries))

    def decode(self, srcs, data_type="", out=None, decompression_config=None):
        assert decompression_config is not None and decompression_config[0] == "config"
        if out is not None and self.owner.refuse_out:
            raise TypeError("decode(): incompatible function arguments")
        import zstandard

        self.owner.decodes += 1
        dctx = zstandard.ZstdDecompressor()
        results, sizes = [], []
        for f, src in enumerate(srcs.entries):
            raw = dctx.decompress(src.numpy().tobytes())
            if f in self.owner.short_frames:
                raw = raw[:-1]
            value = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            if out is not None:
                if len(raw) > out.entries[f].numel():
                    raise ValueError("output buffer too small")
                out.entries[f][: len(raw)] = value
            results.append(value)
            sizes.append(len(raw))
        return FakeBatch(out.entries if out is not None else results, sizes)


class FakeNvcomp(types.ModuleType):
    """The parts of nvidia.nvcomp that dctdata.stages.nvcomp_zstd uses."""

    def __init__(self):
        super().__init__("nvidia.nvcomp")
        self.__version__ = "6.0.0-fake"
        self.BitstreamKind = types.SimpleNamespace(RAW="RAW")
        self.codecs, self.configs, self.decodes, self.arrays = [], 0, 0, []
        self.refuse_out, self.short_frames, self.allocator = False, set(), "unset"

    def Codec(self, **kwargs):  # nvCOMP's name
        return FakeCodec(self, **kwargs)

    def as_arrays(self, buffer, offsets, sizes, cuda_stream=0):
        assert isinstance(offsets, list) and isinstance(sizes, list) and isinstance(cuda_stream, int)
        for o in offsets:
            if (buffer.data_ptr() + o) % 8:
                raise RuntimeError("nvcompErrorAlignment")
        self.arrays.append((offsets, sizes))
        return FakeBatch([buffer[o : o + s] for o, s in zip(offsets, sizes)])

    def set_device_allocator(self, allocator=None):
        self.allocator = allocator


def install_fake_nvcomp(monkeypatch) -> FakeNvcomp:
    """A FakeNvcomp as `nvidia.nvcomp`, with dctdata.stages.nvcomp_zstd decoding CPU tensors and no cached codecs."""
    import dctdata.stages.nvcomp_zstd as nz

    fake = FakeNvcomp()
    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", fake)
    monkeypatch.setattr(nz, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(nz, "_DECODERS", {})
    return fake


def interpreted_kernel(monkeypatch):
    """dctdata.decoder._triton_synth imported afresh under TRITON_INTERPRET=1 (its kernel runs on CPU tensors); call
    `forget_kernel()` afterwards so later imports compile for the GPU again."""
    import dctdata.decoder.fused_cuda as fused_cuda

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sys.modules.pop("dctdata.decoder._triton_synth", None)
    monkeypatch.setattr(fused_cuda, "_kernel_module", None)
    monkeypatch.setattr(fused_cuda, "_broken", None)
    module = fused_cuda._module()
    assert type(module.synthesize_kernel).__name__ == "InterpretedFunction"
    return module


def forget_kernel() -> None:
    sys.modules.pop("dctdata.decoder._triton_synth", None)
