"""Vision models of the zoo, in plain torch, written the way torchvision's eager implementations
run them, so the aten ops match what a user of those models launches: ResNet (He et al. 2016,
the v1.5 bottleneck with the stride on the 3x3 conv, as torchvision's resnet50; the basic block
of resnet18 and resnet34 and the paper's v1 stride where an HF config asks for them), VGG (Simonyan &
Zisserman 2015, torchvision's vgg16 without batch norm) and ViT (Dosovitskiy et al. 2021,
torchvision's vit_b_16: a 16x16 patch conv, a class token, pre-norm blocks).

They read images, not sequences: `example_inputs(batch, seq)` ignores seq and gives a
(batch, channels, image_size, image_size) image batch and (batch,) class labels; the image size is
the config's `image_size` (224). In train mode the forward returns the cross-entropy loss (so the
captured step has the loss and its backward, as a training script runs it); in eval mode the
logits. Blocks sit in one flat Sequential, so a module path's first number is the block index.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.errors import KitError


def num_labels(c) -> int:
    """The classes a config's head predicts: one per entry of id2label, else num_labels, as HF's
    PretrainedConfig reads it (microsoft/resnet-50's and google/vit-base-patch16-224's
    config.json list 1,000 labels in id2label and have no num_labels: they had been refused as
    "missing key 'num_labels'"). Where both are given and disagree, HF builds len(id2label)
    classes and warns; so does the kit (it had built num_labels: 10 against HF's 1,000)."""
    labels = c.get("id2label")
    if not (isinstance(labels, dict) and labels):
        return c["num_labels"]
    if c.get("num_labels", len(labels)) != len(labels):
        warnings.warn(f"config num_labels {c['num_labels']} disagrees with its id2label's "
                      f"{len(labels):,} classes; the head predicts {len(labels):,}, as HF's "
                      "PretrainedConfig builds it")
    return len(labels)


class _ImageClassifier(nn.Module):
    """Shared by the vision models: images in, loss (train) or logits (eval) out."""

    def __init__(self, c):
        super().__init__()
        self.config = c

    def logits(self, x):
        raise NotImplementedError

    def forward(self, images, labels=None):
        out = self.logits(images)
        if self.training and labels is not None:
            return F.cross_entropy(out, labels)
        return out

    def example_inputs(self, batch, seq=None):
        size = self.config.get("image_size", 224)
        channels = self.config.get("num_channels", 3)
        for name, value in (("image_size", size), ("num_channels", channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KitError(f"{self.config.get('model_type')} config: {name} must be a "
                               f"positive whole number, got {value!r}")
        images = torch.empty(batch, channels, size, size, device="meta")
        return (images, torch.zeros(batch, dtype=torch.long, device="meta"))


# -- ResNet -------------------------------------------------------------------------------------
def _shortcut(cin: int, cout: int, stride: int):
    """The projection shortcut (1x1 conv and batch norm) where the block changes the shape."""
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here: ResNet v1.5; on the first 1x1 with stride_first: the
    paper's v1), 1x1 expand; batch norm after each conv."""

    def __init__(self, cin: int, width: int, cout: int, stride: int, stride_first: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, stride=stride if stride_first else 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=1 if stride_first else stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity, inplace=True)


class BasicBlock(nn.Module):
    """Two 3x3 convs (the stride on the first), batch norm after each: ResNet-18 and -34."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity, inplace=True)


LAYER_TYPES = ("bottleneck", "basic")  # HF ResNetConfig's layer_type


def _layout(c) -> tuple[str, bool, bool]:
    """(layer_type, downsample_in_bottleneck, downsample_in_first_stage), HF ResNetConfig's
    defaults where absent. The ResNet had read none of them and built bottlenecks for every
    config: microsoft/resnet-18's (layer_type "basic") came out 1.40M parameters and 0.26e9
    multiply-adds a 224x224 image, against torchvision's resnet18, 11.69M and 1.81e9."""
    kind = c.get("layer_type", "bottleneck")
    if kind not in LAYER_TYPES:
        raise KitError(f"resnet config: layer_type must be one of {', '.join(LAYER_TYPES)}, got {kind!r}")
    flags = []
    for name in ("downsample_in_bottleneck", "downsample_in_first_stage"):
        value = c.get(name, False)
        if not isinstance(value, bool):
            raise KitError(f"resnet config: {name} must be true or false, got {value!r}")
        flags.append(value)
    narrow = [h for h in c.get("hidden_sizes", ()) if h < 4]  # whole and positive: zoo_checks
    if kind == "bottleneck" and narrow:  # a Conv2d(cin, 0, 1) had met a "zero-size convolution"
        raise KitError(f"resnet config: a bottleneck stage is 4x its width, so hidden_sizes must be "
                       f"at least 4 (or layer_type 'basic'), got {c['hidden_sizes']!r}")
    return kind, *flags


class ResNet(_ImageClassifier):
    """HF ResNetConfig keys: embedding_size (stem width), hidden_sizes (stage outputs: 4x the
    bottleneck width, or a basic block's width), depths (blocks per stage), layer_type
    ("bottleneck": ResNet-50 and up, "basic": ResNet-18 and -34), downsample_in_bottleneck (the
    stride on a bottleneck's first 1x1 conv, the paper's v1; default: on the 3x3, v1.5),
    downsample_in_first_stage (stride 2 in the first stage too), num_channels, num_labels
    (or id2label)."""

    def __init__(self, c):
        super().__init__(c)
        kind, stride_first, first_stage_stride = _layout(c)
        stem = c["embedding_size"]
        self.conv1 = nn.Conv2d(c.get("num_channels", 3), stem, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks, cin = [], stem
        for stage, (depth, cout) in enumerate(zip(c["depths"], c["hidden_sizes"])):
            for i in range(depth):
                stride = 2 if i == 0 and (stage > 0 or first_stage_stride) else 1
                blocks.append(BasicBlock(cin, cout, stride) if kind == "basic"
                              else Bottleneck(cin, cout // 4, cout, stride, stride_first))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_labels(c))

    def logits(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x)), inplace=True))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


# -- VGG ----------------------------------------------------------------------------------------
class VGG(_ImageClassifier):
    """`layers`: conv widths with "M" for a 2x2 max pool (VGG's configuration D for vgg16);
    3x3 convs with ReLU, adaptive average pool to 7x7, a 4096-4096 classifier with dropout."""

    def __init__(self, c):
        super().__init__(c)
        feats, cin = [], c.get("num_channels", 3)
        for v in c["layers"]:
            if v == "M":
                feats.append(nn.MaxPool2d(2, stride=2))
            else:
                feats += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*feats)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = c.get("classifier_size", 4096)
        self.classifier = nn.Sequential(
            nn.Linear(cin * 49, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(hidden, num_labels(c)))

    def logits(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- ViT ----------------------------------------------------------------------------------------
class ViTBlock(nn.Module):
    """Pre-norm encoder block: LN, fused qkv projection, SDPA, projection; LN, GELU MLP."""

    def __init__(self, d: int, heads: int, ff: int, eps: float, p: float):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.fc2(self.drop(F.gelu(self.fc1(self.ln_2(x))))))


class ViT(_ImageClassifier):
    """HF ViTConfig keys: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
    patch_size, image_size, num_channels, layer_norm_eps, hidden_dropout_prob; plus num_labels
    (or id2label)."""

    def __init__(self, c):
        super().__init__(c)
        d, patch, size = c["hidden_size"], c["patch_size"], c.get("image_size", 224)
        if size % patch or d % c["num_attention_heads"]:
            raise KitError(f"vit config: image_size {size} must be a multiple of patch_size "
                           f"{patch}, and hidden_size {d} of num_attention_heads "
                           f"{c['num_attention_heads']}")
        self.conv_proj = nn.Conv2d(c.get("num_channels", 3), d, patch, stride=patch)
        self.class_token = nn.Parameter(torch.empty(1, 1, d))
        self.pos_embedding = nn.Parameter(torch.empty(1, (size // patch) ** 2 + 1, d))
        eps, p = c.get("layer_norm_eps", 1e-6), c.get("hidden_dropout_prob", 0.0)
        self.drop = nn.Dropout(p)
        self.layers = nn.Sequential(*(ViTBlock(d, c["num_attention_heads"], c["intermediate_size"],
                                               eps, p) for _ in range(c["num_hidden_layers"])))
        self.ln = nn.LayerNorm(d, eps=eps)
        self.head = nn.Linear(d, num_labels(c))

    def logits(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.layers(self.drop(x + self.pos_embedding))
        return self.head(self.ln(x[:, 0]))
