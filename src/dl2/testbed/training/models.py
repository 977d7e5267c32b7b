"""CPU-sized stand-ins for the 8 DL2 job types, each with a synthetic task that its job's seed fixes.

A stand-in is a small torch model in the spirit of its namesake (convolutional nets for the image models, a
GRU encoder-decoder with attention for seq2seq, an LSTM language model for wlm, an embedding + convolution
text classifier, a two-tower MLP for dssm), a task whose inputs come from a generator and whose targets
follow a fixed rule drawn from the seed (so the loss really falls), a batch size, the number of batches
that make one of its epochs, and the optimizer the parameter servers apply. Models have parameters only
(batch norm uses batch statistics, no running buffers), so the parameters are the whole model state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dl2.errors import Dl2Error

Batch = tuple[torch.Tensor, ...]

IMAGE_SIZE, IMAGE_CLASSES = 16, 10


class Task:
    """A synthetic supervised problem: `batch` draws examples, `loss` scores a model on them."""

    def batch(self, gen: torch.Generator, size: int) -> Batch:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        raise NotImplementedError


class ImageTask(Task):
    """Images are a class's smooth template plus noise; the label is the class."""

    def __init__(self, gen: torch.Generator):
        coarse = torch.randn(IMAGE_CLASSES, 3, 4, 4, generator=gen)
        self.templates = F.interpolate(coarse, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)

    def batch(self, gen: torch.Generator, size: int) -> Batch:
        y = torch.randint(IMAGE_CLASSES, (size,), generator=gen)
        x = self.templates[y] + 1.5 * torch.randn(size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen)
        return x, y

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)


class TextTask(Task):
    """Random token sequences with a few keywords of their class planted at random places."""

    vocab, length, classes, keywords, planted = 256, 32, 4, 8, 3

    def __init__(self, gen: torch.Generator):
        self.words = torch.randperm(self.vocab, generator=gen)[: self.classes * self.keywords].view(self.classes, self.keywords)

    def batch(self, gen: torch.Generator, size: int) -> Batch:
        y = torch.randint(self.classes, (size,), generator=gen)
        x = torch.randint(self.vocab, (size, self.length), generator=gen)
        pos = torch.rand(size, self.length, generator=gen).argsort(dim=1)[:, : self.planted]
        pick = torch.randint(self.keywords, (size, self.planted), generator=gen)
        x.scatter_(1, pos, self.words[y.unsqueeze(1), pick])
        return x, y

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)


class TranslationTask(Task):
    """Translate a token sequence: the target is the source reversed, each token mapped by a fixed permutation."""

    vocab, length = 32, 8  # token 0 starts every target sequence

    def __init__(self, gen: torch.Generator):
        self.mapping = torch.randperm(self.vocab - 1, generator=gen) + 1

    def batch(self, gen: torch.Generator, size: int) -> Batch:
        src = torch.randint(1, self.vocab, (size, self.length), generator=gen)
        return src, self.mapping[src - 1].flip(1)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        src, tgt = batch
        start = torch.zeros_like(tgt[:, :1])
        logits = model(src, torch.cat([start, tgt[:, :-1]], dim=1))
        return F.cross_entropy(logits.reshape(-1, self.vocab), tgt.reshape(-1))


class LanguageTask(Task):
    """Sentences of a fixed random Markov chain in which every word has a few likely successors."""

    vocab, length, successors = 64, 24, 3

    def __init__(self, gen: torch.Generator):
        nxt = torch.stack([torch.randperm(self.vocab, generator=gen)[: self.successors] for _ in range(self.vocab)])
        self.transition = torch.full((self.vocab, self.vocab), 0.1 / self.vocab)
        self.transition.scatter_(1, nxt, 0.9 / self.successors)

    def batch(self, gen: torch.Generator, size: int) -> Batch:
        words = [torch.randint(self.vocab, (size,), generator=gen)]
        for _ in range(self.length):
            words.append(torch.multinomial(self.transition[words[-1]], 1, generator=gen).squeeze(1))
        return (torch.stack(words, dim=1),)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        (seq,) = batch
        logits = model(seq[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab), seq[:, 1:].reshape(-1))


class MatchingTask(Task):
    """Query and document features are two noisy views of one latent; the match is the document of the same row."""

    latent, features = 16, 64

    def __init__(self, gen: torch.Generator):
        self.to_query = torch.randn(self.latent, self.features, generator=gen)
        self.to_doc = torch.randn(self.latent, self.features, generator=gen)

    def batch(self, gen: torch.Generator, size: int) -> Batch:
        z = torch.randn(size, self.latent, generator=gen)
        noise = torch.randn(2, size, self.features, generator=gen)
        return torch.tanh(z @ self.to_query) + 0.3 * noise[0], torch.tanh(z @ self.to_doc) + 0.3 * noise[1]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        query, doc = batch
        scores = model(query, doc)
        return F.cross_entropy(scores, torch.arange(len(query)))


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, track_running_stats=False)


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), _bn(cout), nn.ReLU())


class Bottleneck(nn.Module):
    """A residual bottleneck (1x1, 3x3 with `groups`, 1x1) with a projection shortcut when the shape changes."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int = 1, groups: int = 1):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, mid, 1), _conv_bn(mid, mid, 3, stride, groups),
                                  nn.Conv2d(mid, cout, 1, bias=False), _bn(cout))
        self.skip = nn.Identity() if cin == cout and stride == 1 else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _bn(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


class Inception(nn.Module):
    """An inception module: 1x1, 1x1-3x3, 1x1-3x3-3x3 and pool-1x1 branches, concatenated."""

    def __init__(self, cin: int, width: int):
        super().__init__()
        self.branches = nn.ModuleList([
            _conv_bn(cin, width, 1),
            nn.Sequential(_conv_bn(cin, width, 1), _conv_bn(width, width)),
            nn.Sequential(_conv_bn(cin, width, 1), _conv_bn(width, width), _conv_bn(width, width)),
            nn.Sequential(nn.AvgPool2d(3, 1, 1), _conv_bn(cin, width, 1)),
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], dim=1)


def _classifier_head(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, IMAGE_CLASSES))


def resnet() -> nn.Module:
    """ResNet-50 in miniature: a stem and three stages of bottleneck blocks."""
    return nn.Sequential(_conv_bn(3, 16), Bottleneck(16, 8, 32), Bottleneck(32, 16, 64, stride=2), Bottleneck(64, 16, 64),
                         Bottleneck(64, 32, 128, stride=2), _classifier_head(128))


def vgg() -> nn.Module:
    """VGG-16 in miniature: stacked 3x3 convolutions and pooling, then wide fully connected layers (the largest model)."""
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 64), nn.Flatten(), nn.Linear(64 * 2 * 2, 512), nn.ReLU(),
                         nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, IMAGE_CLASSES))


def resnext() -> nn.Module:
    """ResNeXt-110 in miniature: a deep, narrow stack of grouped-convolution bottlenecks (the smallest image model)."""
    return nn.Sequential(_conv_bn(3, 16), Bottleneck(16, 16, 32, groups=4), Bottleneck(32, 16, 32, groups=4),
                         Bottleneck(32, 32, 64, stride=2, groups=8), Bottleneck(64, 32, 64, groups=8),
                         Bottleneck(64, 32, 64, stride=2, groups=8), Bottleneck(64, 32, 64, groups=8), _classifier_head(64))


def inception() -> nn.Module:
    """Inception-BN in miniature: a stem, two inception modules with batch norm and pooling between them."""
    return nn.Sequential(_conv_bn(3, 24), nn.MaxPool2d(2), Inception(24, 12), nn.MaxPool2d(2), Inception(48, 16), _classifier_head(64))


class Seq2Seq(nn.Module):
    """A GRU encoder and a GRU decoder with dot-product attention over the encoder states."""

    def __init__(self, vocab: int = TranslationTask.vocab, dim: int = 48):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(vocab, dim), nn.Embedding(vocab, dim)
        self.encoder, self.decoder = nn.GRU(dim, dim, batch_first=True), nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(2 * dim, vocab)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, hidden = self.encoder(self.src_embed(src))
        states, _ = self.decoder(self.tgt_embed(tgt_in), hidden)
        attention = torch.softmax(states @ memory.transpose(1, 2), dim=-1)
        return self.out(torch.cat([states, attention @ memory], dim=-1))


class TextCNN(nn.Module):
    """Embeddings, parallel 1-D convolutions of widths 3, 4 and 5, max-pooling over time, a linear classifier."""

    def __init__(self, vocab: int = TextTask.vocab, dim: int = 32, filters: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.convs = nn.ModuleList([nn.Conv1d(dim, filters, k) for k in (3, 4, 5)])
        self.out = nn.Linear(3 * filters, TextTask.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x).transpose(1, 2)
        return self.out(torch.cat([F.relu(c(e)).amax(dim=2) for c in self.convs], dim=1))


class TwoTower(nn.Module):
    """DSSM: a query tower and a document tower (MLPs) whose cosine similarities, scaled, score every pair."""

    def __init__(self, features: int = MatchingTask.features, hidden: int = 128, dim: int = 32, scale: float = 10.0):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, dim))
        self.doc = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, dim))
        self.scale = scale

    def forward(self, query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        q, d = F.normalize(self.query(query), dim=1), F.normalize(self.doc(doc), dim=1)
        return self.scale * q @ d.T


class WordLM(nn.Module):
    """A word-level LSTM language model with tied input and output embeddings."""

    def __init__(self, vocab: int = LanguageTask.vocab, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        return h @ self.embed.weight.T


@dataclass(frozen=True)
class StandIn:
    """One job type's stand-in: its model, task, batch size, batches per epoch and PS optimizer."""

    name: str
    build: Callable[[], nn.Module]
    task: Callable[[torch.Generator], Task]
    batch_size: int
    steps_per_epoch: int
    optimizer: str  # "sgd" (momentum 0.9) or "adam"
    lr: float

    def model(self, seed: int) -> nn.Module:
        """The model with its initial parameters for `seed`."""
        torch.manual_seed(seed)
        return self.build()

    def make_task(self, seed: int) -> Task:
        """The synthetic task of a job with `seed` (its fixed rule; batches come from another generator)."""
        return self.task(torch.Generator().manual_seed(seed))

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The optimizer a parameter server applies to its shard."""
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)


STANDINS: dict[str, StandIn] = {s.name: s for s in [
    StandIn("resnet-50", resnet, ImageTask, 32, 50, "sgd", 0.05),
    StandIn("vgg-16", vgg, ImageTask, 32, 50, "adam", 0.001),
    StandIn("resnext-110", resnext, ImageTask, 32, 100, "sgd", 0.05),
    StandIn("inception-bn", inception, ImageTask, 32, 50, "sgd", 0.05),
    StandIn("seq2seq", Seq2Seq, TranslationTask, 32, 100, "adam", 0.01),
    StandIn("cnn-text-classification", TextCNN, TextTask, 32, 50, "adam", 0.003),
    StandIn("dssm", TwoTower, MatchingTask, 64, 100, "adam", 0.003),
    StandIn("wlm", WordLM, LanguageTask, 32, 50, "adam", 0.01),
]}


def get_standin(name: str) -> StandIn:
    """The stand-in of the job type `name`; an unknown name is an error listing the known ones."""
    try:
        return STANDINS[name]
    except KeyError:
        raise Dl2Error(f"unknown model {name!r} (known: {', '.join(STANDINS)})") from None
