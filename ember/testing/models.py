"""Tiny random-weight models for sweeps: transformers architectures that build offline, plus a
hand-written ResNet block.

Each `ModelCase` builds its model (seeded, dropout off) and its inputs; `inputs` include the
labels, so `model(**inputs)` returns a loss for a training step, and `outputs(result)` picks
the tensors to compare with eager. Sizes are small enough that a whole sweep runs in minutes
on two cores, large enough that every layer type shows up in the graph.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

VOCAB, SEQ, BATCH, HIDDEN = 256, 32, 2, 64


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[], tuple[nn.Module, dict[str, Any]]]
    kind: str  # "text", "seq2seq", "vision", "audio", "conv"


def _ids(n: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, n), generator=torch.Generator().manual_seed(1))


def _pixels(size: int = 32, channels: int = 3) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=torch.Generator().manual_seed(2))


def _transformers(config: str, model: str, inputs: Callable[[], dict], **cfg: Any) -> Callable:
    def build() -> tuple[nn.Module, dict[str, Any]]:
        import transformers

        transformers.logging.set_verbosity_error()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conf = getattr(transformers, config)(**cfg)
            _no_dropout(conf)
            torch.manual_seed(0)
            return getattr(transformers, model)(conf), inputs()

    return build


def _no_dropout(conf: Any) -> None:
    """Every dropout-like probability of a config (and its sub-configs) set to 0, so that
    training runs are deterministic and comparable with eager."""
    for key, value in list(vars(conf).items()):
        if "drop" in key and isinstance(value, float):
            setattr(conf, key, 0.0)
        elif hasattr(value, "to_dict") and value is not conf:
            _no_dropout(value)


def _lm() -> dict:
    ids = _ids()
    return {"input_ids": ids, "labels": ids}


def _cls() -> dict:
    return {"input_ids": _ids(), "labels": torch.tensor([0, 1])}


def _seq2seq() -> dict:
    ids = _ids()
    return {"input_ids": ids, "labels": _ids(SEQ // 2)}


def _image() -> dict:
    return {"pixel_values": _pixels(), "labels": torch.tensor([0, 1])}


def _text_and_image() -> dict:
    return {"input_ids": _ids(), "pixel_values": _pixels(), "return_loss": True}


def _audio() -> dict:
    features = torch.randn(BATCH, 16, 64, generator=torch.Generator().manual_seed(3))
    return {"input_features": features, "labels": _ids(SEQ // 2)}


_DECODER = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2)
_HEADS = dict(num_attention_heads=4, max_position_embeddings=128)
_ENCODER = dict(**_DECODER, **_HEADS, num_labels=2)
_VIT = dict(
    image_size=32, patch_size=8, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2
)


class ResNetBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus a shortcut, then ReLU; a global pool and a linear head."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 10)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn0(self.stem(pixel_values)))
        y = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(y)) + x)
        logits = self.head(x.mean((2, 3)))
        return nn.functional.cross_entropy(logits, labels)


def _resnet_block() -> tuple[nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    return ResNetBlock(), _image()


CASES = [
    ModelCase("resnet_block", _resnet_block, "conv"),
    ModelCase(
        "bert",
        _transformers("BertConfig", "BertForSequenceClassification", _cls, **_ENCODER),
        "text",
    ),
    ModelCase(
        "roberta",
        _transformers(
            "RobertaConfig", "RobertaForSequenceClassification", _cls, **_ENCODER, pad_token_id=1
        ),
        "text",
    ),
    ModelCase(
        "distilbert",
        _transformers(
            "DistilBertConfig",
            "DistilBertForSequenceClassification",
            _cls,
            vocab_size=VOCAB,
            dim=HIDDEN,
            hidden_dim=128,
            n_layers=2,
            n_heads=4,
            num_labels=2,
        ),
        "text",
    ),
    ModelCase(
        "albert",
        _transformers(
            "AlbertConfig", "AlbertForSequenceClassification", _cls, **_ENCODER, embedding_size=32
        ),
        "text",
    ),
    ModelCase(
        "electra",
        _transformers(
            "ElectraConfig", "ElectraForSequenceClassification", _cls, **_ENCODER, embedding_size=32
        ),
        "text",
    ),
    ModelCase(
        "gpt2",
        _transformers(
            "GPT2Config",
            "GPT2LMHeadModel",
            _lm,
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=4,
            n_positions=128,
        ),
        "text",
    ),
    ModelCase(
        "gptj",
        _transformers(
            "GPTJConfig",
            "GPTJForCausalLM",
            _lm,
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=4,
            n_positions=128,
            rotary_dim=8,
        ),
        "text",
    ),
    ModelCase(
        "gpt_neox",
        _transformers("GPTNeoXConfig", "GPTNeoXForCausalLM", _lm, **_DECODER, **_HEADS),
        "text",
    ),
    ModelCase(
        "opt",
        _transformers(
            "OPTConfig",
            "OPTForCausalLM",
            _lm,
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=HIDDEN,
            max_position_embeddings=128,
        ),
        "text",
    ),
    ModelCase(
        "llama",
        _transformers(
            "LlamaConfig", "LlamaForCausalLM", _lm, **_DECODER, **_HEADS, num_key_value_heads=2
        ),
        "text",
    ),
    ModelCase(
        "mistral",
        _transformers(
            "MistralConfig", "MistralForCausalLM", _lm, **_DECODER, **_HEADS, num_key_value_heads=2
        ),
        "text",
    ),
    ModelCase(
        "qwen2",
        _transformers(
            "Qwen2Config", "Qwen2ForCausalLM", _lm, **_DECODER, **_HEADS, num_key_value_heads=2
        ),
        "text",
    ),
    ModelCase(
        "gemma",
        _transformers(
            "GemmaConfig",
            "GemmaForCausalLM",
            _lm,
            **_DECODER,
            **_HEADS,
            num_key_value_heads=2,
            head_dim=16,
        ),
        "text",
    ),
    ModelCase(
        "phi", _transformers("PhiConfig", "PhiForCausalLM", _lm, **_DECODER, **_HEADS), "text"
    ),
    ModelCase(
        "bart",
        _transformers(
            "BartConfig",
            "BartForConditionalGeneration",
            _seq2seq,
            vocab_size=VOCAB,
            d_model=HIDDEN,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=128,
        ),
        "seq2seq",
    ),
    ModelCase(
        "t5",
        _transformers(
            "T5Config",
            "T5ForConditionalGeneration",
            _seq2seq,
            vocab_size=VOCAB,
            d_model=HIDDEN,
            d_kv=16,
            d_ff=128,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        "seq2seq",
    ),
    ModelCase(
        "vit",
        _transformers(
            "ViTConfig",
            "ViTForImageClassification",
            _image,
            **_VIT,
            num_attention_heads=4,
            num_labels=2,
        ),
        "vision",
    ),
    ModelCase(
        "resnet",
        _transformers(
            "ResNetConfig",
            "ResNetForImageClassification",
            _image,
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_labels=2,
        ),
        "conv",
    ),
    ModelCase(
        "convnext",
        _transformers(
            "ConvNextConfig",
            "ConvNextForImageClassification",
            _image,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_stages=2,
            num_labels=2,
        ),
        "conv",
    ),
    ModelCase(
        "regnet",
        _transformers(
            "RegNetConfig",
            "RegNetForImageClassification",
            _image,
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            groups_width=8,
            num_labels=2,
        ),
        "conv",
    ),
    ModelCase(
        "mobilenet_v2",
        _transformers(
            "MobileNetV2Config",
            "MobileNetV2ForImageClassification",
            _image,
            image_size=32,
            depth_multiplier=0.25,
            num_labels=2,
        ),
        "conv",
    ),
    ModelCase(
        "clip",
        _transformers(
            "CLIPConfig",
            "CLIPModel",
            _text_and_image,
            text_config=dict(
                vocab_size=VOCAB,
                hidden_size=HIDDEN,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=SEQ,
            ),
            vision_config=dict(**_VIT, num_attention_heads=4),
            projection_dim=32,
        ),
        "vision",
    ),
    ModelCase(
        "whisper",
        _transformers(
            "WhisperConfig",
            "WhisperForConditionalGeneration",
            _audio,
            vocab_size=VOCAB,
            num_mel_bins=16,
            d_model=HIDDEN,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_source_positions=32,
            max_target_positions=64,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        "audio",
    ),
    ModelCase(
        "swin",
        _transformers(
            "SwinConfig",
            "SwinForImageClassification",
            _image,
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
            num_labels=2,
        ),
        "vision",
    ),
]


def by_name(name: str) -> ModelCase:
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no model case {name!r}; known: {', '.join(c.name for c in CASES)}")


def loss_of(result: Any) -> torch.Tensor:
    """The scalar loss of a model's result (a ModelOutput with .loss, or the loss itself)."""
    return result if isinstance(result, torch.Tensor) else result.loss


def outputs(result: Any) -> list[torch.Tensor]:
    """The tensors of a result worth comparing: the loss and the logits when present."""
    if isinstance(result, torch.Tensor):
        return [result]
    return [
        t for t in (getattr(result, "loss", None), getattr(result, "logits", None)) if t is not None
    ]
