"""An F16 copy of a quantized GGUF, for the parity board's llama-server rows:
    python bench/f16_copy.py IN.gguf OUT.gguf

Every quantized tensor is dequantized (gguf's own reference dequantization) and stored as F16; F32
and F16 tensors and every metadata key are copied as they are. Why: llama.cpp's CPU path multiplies
quantized weights with exact integer block dots, the same for one row as for many, while F16 weights
take `ggml_vec_dot_f16` for one row and llamafile's tinyBLAS tiles for two or more, so only a float
copy of the same model shows whether its batching changes logprobs."""

import sys

import gguf
import numpy as np

KEPT = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16}


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for field in reader.fields.values():
        # The architecture and the GGUF.* fields are the writer's own to write.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = gguf.LlamaFileType.MOSTLY_F16
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)


def main(source: str, target: str) -> None:
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch)
    copy_metadata(reader, writer)
    for tensor in reader.tensors:
        if tensor.tensor_type in KEPT:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
        else:
            weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float16)
            writer.add_tensor(tensor.name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
