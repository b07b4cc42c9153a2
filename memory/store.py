"""SkillStore: skill records in a persistent Chroma collection, shared across runs (DESIGN §3, §7).

One collection, `skills`, in a `chromadb.PersistentClient` directory (telemetry off). Each record is
stored whole as JSON in its metadata beside the flat fields that filters use (`factor`, `outcome`,
`general`, `d_<domain>` flags); the embedded document is the skill's trigger text. The embedding
function (memory/embeddings.py) is registered with Chroma and recorded in the collection, so a store
reopened in a new process embeds queries the way it embedded its records, and asking for another
embedding is refused.

Opening never writes: a path that is a file, a non-empty folder that is not a Chroma store, a
database that is not SQLite, or a mismatched embedding is one UserError and the folder is left as it
was. Writes from several processes are serialised by a lock file beside the database.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock
from pydantic import BaseModel, ValidationError

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text, read_user_text
from evotrainer.memory.skill import Skill, SkillOutcome

COLLECTION = "skills"
DEFAULT_EMBEDDING = "minilm"
SIGNATURE_WEIGHT = 0.20  # score bonus for a full match of the findings' analyzer ids (chosen by bench_retrieval.py)
_SQLITE_MAGIC = b"SQLite format 3\x00"


def default_path() -> Path:
    """`$EVOTRAINER_SKILLS`, else `~/.evotrainer/skills`."""
    return Path(os.environ.get("EVOTRAINER_SKILLS") or Path.home() / ".evotrainer" / "skills")


class Hit(BaseModel):
    skill: Skill
    score: float  # cosine similarity of the query to the skill's trigger, in [-1, 1]


def _check_path(path: Path) -> bool:
    """Whether a store exists at `path`; refuse anything that is neither a store nor empty."""
    if path.exists() and not path.is_dir():
        raise UserError(f"skill store {path} is a file, not a folder: pass --skills with a folder path")
    db = path / "chroma.sqlite3"
    if db.is_file():
        try:
            with db.open("rb") as f:
                magic = f.read(16)
        except OSError as e:
            raise UserError(f"skill store {path} is unreadable ({e.strerror}): fix its permissions") from None
        if magic != _SQLITE_MAGIC:
            raise UserError(f"skill store {path} is corrupt: {db.name} is not a SQLite database; restore it from "
                            "an export (`evotrainer skills import`) into a new folder")
        return True
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"{path} is not a skill store (no chroma.sqlite3) and not empty: pass an empty or new "
                        "folder with --skills")
    return False


def _peek_embedding(db: Path) -> str | None:
    """The embedding recorded in a store, read through a read-only SQLite connection (opening a Chroma client
    rewrites pages of its database, so a store is checked before one is opened). None if Chroma's tables are
    not where this version expects them: the client then decides."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT m.str_value FROM collections c JOIN collection_metadata m ON m.collection_id = "
                              "c.id WHERE c.name = ? AND m.key = 'embedding'", (COLLECTION,)).fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        if "malformed" in str(e) or "not a database" in str(e):
            raise UserError(f"skill store {db.parent} is corrupt ({e}); restore it from an export into a new "
                            "folder") from None
        return None
    return row[0] if row else None


def _embeddings() -> dict:
    """The embedding functions by name, imported when a store is opened: importing Chroma costs about a second, and
    the modules that only name this one's types (every `evotrainer` command imports the agents' schemas) need not
    pay it."""
    from evotrainer.memory.embeddings import EMBEDDINGS

    return EMBEDDINGS


class SkillStore:
    """Skills in a Chroma collection at `path` (default `default_path()`).

    `embedding` is `minilm` or `hashing`; None means the store's own, or `minilm` for a new store.
    """

    def __init__(self, path: str | Path | None = None, embedding: str | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        functions = _embeddings()
        if embedding is not None and embedding not in functions:
            raise UserError(f"unknown embedding {embedding!r}: choose one of {', '.join(functions)}")
        self._client = self._col = None  # a new store is created by its first write: opening never writes
        self.embedding = embedding or DEFAULT_EMBEDDING
        self._ef = None
        if _check_path(self.path):
            self._open(embedding)
        if self._ef is None:
            self._ef = functions[self.embedding]()

    def _connect(self) -> None:
        import chromadb
        from chromadb.config import Settings

        try:
            self._client = chromadb.PersistentClient(path=str(self.path), settings=Settings(
                anonymized_telemetry=False, allow_reset=False))
        except Exception as e:  # chromadb raises many types for a damaged store
            raise UserError(f"skill store {self.path} cannot be opened ({type(e).__name__}: {e}); restore it from "
                            "an export into a new folder") from None

    def _open(self, embedding: str | None) -> None:
        built = _peek_embedding(self.path / "chroma.sqlite3")
        if built and embedding is not None and embedding != built:  # refused before Chroma touches the files
            raise UserError(f"skill store {self.path} was built with the {built!r} embedding, not {embedding!r}: "
                            f"open it with --embedding {built}, or export it and import into a new store")
        self._connect()
        try:
            listed = {c.name: c for c in self._client.list_collections()}
            if COLLECTION not in listed:
                if listed:
                    raise UserError(f"{self.path} is a Chroma store without a `{COLLECTION}` collection: not a "
                                    "skill store; pass another --skills folder")
                return  # created, never written: a new store
            built = (listed[COLLECTION].metadata or {}).get("embedding")
            if built not in _embeddings():
                raise UserError(f"skill store {self.path} was built with an unknown embedding {built!r}")
            if embedding is not None and embedding != built:
                raise UserError(f"skill store {self.path} was built with the {built!r} embedding, not {embedding!r}: "
                                f"open it with --embedding {built}, or export it and import into a new store")
            # this handle's own instance: without one, Chroma rebuilds the function from the collection's
            # configuration on every query, and MiniLM would load its model each time (about 0.3 s)
            self.embedding, self._ef = built, _embeddings()[built]()
            self._col = self._client.get_collection(COLLECTION, embedding_function=self._ef)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"skill store {self.path} cannot be read ({type(e).__name__}: {e}); restore it from "
                            "an export into a new folder") from None

    # ---- writing ----

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        self.path.mkdir(parents=True, exist_ok=True)
        with FileLock(self.path / ".lock"):  # blocking; excludes other threads and other processes alike
            if self._client is None:
                self._connect()
            if self._col is None:
                self._col = self._client.get_or_create_collection(
                    COLLECTION, embedding_function=self._ef, configuration={"hnsw": {"space": "cosine"}},
                    metadata={"embedding": self.embedding, "dim": self._ef.DIM})
            yield self._col

    @staticmethod
    def _metadata(skill: Skill) -> dict[str, Any]:
        meta: dict[str, Any] = {"factor": skill.factor, "outcome": skill.outcome, "general": skill.general,
                                "transform": skill.transform or "", "updated": skill.updated,
                                "record": skill.model_dump_json()}
        meta.update({f"d_{d}": True for d in {v.domain for v in skill.validations} | set(skill.domains)})
        return meta

    def put(self, skills: Skill | list[Skill]) -> None:
        """Insert or replace skills by id (their trigger text is re-embedded)."""
        skills = [skills] if isinstance(skills, Skill) else skills
        if not skills:
            return
        with self._writing() as col:
            for i in range(0, len(skills), 1000):
                chunk = skills[i:i + 1000]
                col.upsert(ids=[s.id for s in chunk], documents=[s.document() for s in chunk],
                           metadatas=[self._metadata(s) for s in chunk])

    def _touch(self, skills: list[Skill]) -> None:
        """Rewrite metadata only (counters), keeping the embeddings."""
        with self._writing() as col:
            col.update(ids=[s.id for s in skills], metadatas=[self._metadata(s) for s in skills])

    def record_use(self, skill_id: str) -> Skill:
        """A Planner put this skill into a plan."""
        skill = self.get(skill_id)
        skill.used += 1
        self._touch([skill])
        return skill

    def record_outcome_after_use(self, skill_id: str, outcome: SkillOutcome) -> Skill:
        """What became of a plan that used this skill."""
        skill = self.get(skill_id)
        skill.outcomes_after_use.append(outcome)
        self._touch([skill])
        return skill

    # ---- reading ----

    def __len__(self) -> int:
        return 0 if self._col is None else self._col.count()

    def get(self, skill_id: str) -> Skill:
        got = None if self._col is None else self._col.get(ids=[skill_id], include=["metadatas"])
        if not got or not got["ids"]:
            raise UserError(f"no skill {skill_id!r} in {self.path}: `evotrainer skills list` shows the ids")
        return Skill.model_validate_json(got["metadatas"][0]["record"])

    @staticmethod
    def _where(domain: str | None, outcome: str | None, factor: str | None) -> dict | None:
        clauses: list[dict] = []
        if domain:  # a skill from this domain, or one that held in several domains
            clauses.append({"$or": [{f"d_{domain}": True}, {"general": True}]})
        if outcome:
            clauses.append({"outcome": outcome})
        if factor:
            clauses.append({"factor": factor})
        if not clauses:
            return None
        return clauses[0] if len(clauses) == 1 else {"$and": clauses}

    def list(self, domain: str | None = None, outcome: str | None = None, factor: str | None = None) -> list[Skill]:
        """Every skill matching the filters, most recently updated first."""
        if self._col is None:
            return []
        got = self._col.get(where=self._where(domain, outcome, factor), include=["metadatas"])
        skills = [Skill.model_validate_json(m["record"]) for m in got["metadatas"]]
        return sorted(skills, key=lambda s: s.updated, reverse=True)

    def query(self, text: str, k: int = 5, domain: str | None = None, outcome: str | None = None,
              factor: str | None = None, analyzers: list[str] | None = None, record: bool = True) -> list[Hit]:
        """The k skills whose trigger is closest to `text`, positive and negative alike unless filtered.

        `analyzers` (the ids of the findings behind the diagnosis) rerank the nearest candidates: the score is
        the cosine similarity plus SIGNATURE_WEIGHT x the Jaccard overlap with the skill's trigger analyzers,
        since a diagnosis is a signature of findings as much as a text. `record` counts the retrieval."""
        if self._col is None or not text.strip():
            return []
        n = max(4 * k, 20) if analyzers else k
        got = self._col.query(query_texts=[text], n_results=n, where=self._where(domain, outcome, factor),
                              include=["metadatas", "distances"])
        hits = [Hit(skill=Skill.model_validate_json(m["record"]), score=1.0 - d)
                for m, d in zip(got["metadatas"][0], got["distances"][0])]
        if analyzers:
            wanted = set(analyzers)
            for h in hits:
                have = set(h.skill.trigger.analyzers)
                h.score += SIGNATURE_WEIGHT * len(wanted & have) / len(wanted | have)
            hits = sorted(hits, key=lambda h: h.score, reverse=True)[:k]
        if record and hits:
            for h in hits:
                h.skill.retrieved += 1
            self._touch([h.skill for h in hits])
        return hits

    # ---- export and import ----

    def export(self, path: str | Path) -> int:
        """Every skill as one JSON line, every field included; returns the count."""
        skills = sorted(self.list(), key=lambda s: s.created)
        atomic_write_text(path, "".join(s.model_dump_json() + "\n" for s in skills))
        return len(skills)

    def import_(self, path: str | Path) -> tuple[int, int]:
        """Add the skills of a JSONL export; ids already present are kept as they are. Returns (added,
        skipped). A bad line fails the whole import before anything is written."""
        path = Path(path)
        lines = read_user_text(path, "skills export").splitlines()
        skills = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                skills.append(Skill.model_validate_json(line))
            except ValidationError as e:
                first = e.errors()[0]
                raise UserError(f"{path}:{n} is not a skill record ({'.'.join(map(str, first['loc']))}: "
                                f"{first['msg']}); nothing imported") from None
        if not skills:
            return 0, 0
        present = set() if self._col is None else set(self._col.get(ids=[s.id for s in skills])["ids"])
        new = [s for s in skills if s.id not in present]
        self.put(new)
        return len(new), len(skills) - len(new)
