//! The session's memory stores, put into its sandbox before any tool runs
//! and synced back when the run ends cleanly, as the official worker does
//! with its workdir.
//!
//! Down: every `memory_store` of the session's `resources`, listed with
//! its content (`GET /v1/memory_stores/{id}/memories?view=full&limit=20`,
//! all pages; the item's `sessions_token` and `anthropic-beta:
//! agent-memory-2026-07-22`, the only credential and beta those endpoints
//! take), goes to the store's `mount_path` when the sandbox can hold it
//! there, else to `{workdir}/{spec.memory.directory}/<name or id>/`, with
//! the SDK's `.anthropic-memory-store` marker (`version 1\n<store id>`).
//! A read-only store's files are made read-only.
//!
//! Back, at a clean end (the session ended or went idle, not a lost
//! lease): the store's directory is listed in the sandbox (path, size,
//! SHA-256 of each regular file; symlinks are not followed), compared
//! with what was put there, and each new file is created
//! (`POST …/memories {path, content}`) and each changed one updated with
//! a `content_sha256` precondition on what was downloaded (a memory
//! changed elsewhere meanwhile wins, as with the SDK). Files deleted in
//! the sandbox are **not** deleted on the server (the SDK deletes only
//! after 30 s of corroboration; a single end-of-run pass cannot
//! corroborate), and nothing changed remotely during the run is pulled.
//!
//! Bounds: 1 000 files per store, 1 MiB per file, 64 MiB read back per
//! store; a store past them is not mounted (down) or not synced (back),
//! with a warning. Nothing here fails the run.

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::{MEMORY_PAGE_LIMIT, ManagedApi, Memory};
use crate::files::{PutFile, Sandbox, Tools, join, quote};
use crate::skills::{dir_name, safe_name};

/// The marker file at every store's root; never synced.
pub const MARKER: &str = ".anthropic-memory-store";
/// The most files a store may have, either way.
pub const MAX_FILES: usize = 1000;
/// The largest memory file, either way.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// The most bytes read back from one store's directory.
pub const MAX_READ_BACK: usize = 64 << 20;
/// Pages of a listing read at most.
const MAX_PAGES: usize = MAX_FILES / MEMORY_PAGE_LIMIT as usize + 2;

/// The marker's content for a store.
pub fn marker_text(store_id: &str) -> String {
    format!("version 1\n{store_id}")
}

fn sha_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// A memory store attached to the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRef {
    /// `memstore_...`.
    pub id: String,
    /// Its display name, if any.
    pub name: Option<String>,
    /// Attached read-only: put, never synced back.
    pub read_only: bool,
    /// Where the agent was told it is (absolute), if anywhere.
    pub mount_path: Option<String>,
}

/// The memory stores of a session's `resources`.
pub fn stores(resources: &[Value]) -> Vec<StoreRef> {
    resources
        .iter()
        .filter(|r| r.get("type").and_then(Value::as_str) == Some("memory_store"))
        .filter_map(|r| {
            let s = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned);
            Some(StoreRef {
                id: s("memory_store_id").filter(|i| !i.is_empty())?,
                name: s("name").filter(|n| !n.is_empty()),
                read_only: s("access").as_deref() == Some("read_only"),
                mount_path: s("mount_path").filter(|m| !m.is_empty()),
            })
        })
        .collect()
}

/// Where a store may go, in order of preference: its `mount_path` when it
/// is a clean absolute path, then `{directory}/<name or id>` under the
/// workdir (`directory` itself checked: relative, no `..`).
pub fn candidate_dirs(r: &StoreRef, directory: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = &r.mount_path
        && let Some(rest) = m.strip_prefix('/')
        && let Ok(Some(clean)) = safe_name(rest)
        && clean == rest.trim_end_matches('/')
    {
        out.push(format!("/{clean}"));
    }
    let base = match safe_name(directory) {
        Ok(Some(d)) => d,
        _ => "memory".to_owned(),
    };
    out.push(join(
        &base,
        &dir_name(r.name.as_deref().unwrap_or(""), &r.id),
    ));
    out
}

/// Path (no leading `/`) -> (memory id, SHA-256) of what was put.
pub type Baseline = BTreeMap<String, (String, String)>;

/// A store put into the sandbox.
#[derive(Debug, Clone)]
pub struct Mounted {
    /// The store.
    pub store: StoreRef,
    /// Its directory in the sandbox (relative to the workdir, or absolute).
    pub dir: String,
    /// What was put there.
    pub baseline: Baseline,
}

/// The memories of a store that can be put, and why the others cannot.
pub fn files_of(store_id: &str, memories: Vec<Memory>) -> (Vec<PutFile>, Baseline, Vec<String>) {
    let mut files = vec![PutFile {
        path: MARKER.into(),
        data: marker_text(store_id).into_bytes(),
        executable: false,
    }];
    let mut baseline = BTreeMap::new();
    let mut skipped = Vec::new();
    for m in memories {
        if m.kind != "memory" {
            continue;
        }
        let rel = match safe_name(m.path.trim_start_matches('/')) {
            Ok(Some(r)) if r != MARKER && !baseline.contains_key(&r) => r,
            Ok(_) => {
                skipped.push(format!("{:?}: reserved, empty or repeated path", m.path));
                continue;
            }
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        let content = m.content.unwrap_or_default().into_bytes();
        if content.len() > MAX_FILE_BYTES {
            skipped.push(format!("{rel}: over {MAX_FILE_BYTES} bytes"));
            continue;
        }
        let sha = sha_hex(&content);
        baseline.insert(rel.clone(), (m.id, sha));
        files.push(PutFile {
            path: rel,
            data: content,
            executable: false,
        });
    }
    (files, baseline, skipped)
}

/// One regular file found in a store's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// Its SHA-256, or none when it is over [`MAX_FILE_BYTES`] (not hashed).
    pub sha: Option<String>,
    /// Its size.
    pub size: usize,
}

/// The listing the sandbox printed: `SHA SIZE BASE64(PATH)` per line (`-`
/// for the SHA of a file too large to hash). Refuses more than
/// [`MAX_FILES`] files (plus the marker) and malformed lines.
pub fn parse_manifest(text: &str) -> Result<BTreeMap<String, Local>, String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if out.len() > MAX_FILES {
            return Err(format!("more than {MAX_FILES} files"));
        }
        let mut it = line.split(' ');
        let (Some(sha), Some(size), Some(p), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(format!("a malformed listing line: {line:?}"));
        };
        let size: usize = size
            .parse()
            .map_err(|_| format!("a malformed size: {line:?}"))?;
        let sha = match sha {
            "-" => None,
            s if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => Some(s.to_owned()),
            _ => return Err(format!("a malformed SHA-256: {line:?}")),
        };
        let path = b64
            .decode(p)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| format!("a malformed path: {line:?}"))?;
        out.insert(path, Local { sha, size });
    }
    if out.len() > MAX_FILES + 1 {
        return Err(format!("more than {MAX_FILES} files"));
    }
    Ok(out)
}

/// What a sync does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// New files: created.
    pub create: Vec<String>,
    /// Changed files: (path, memory id, SHA-256 as downloaded).
    pub update: Vec<(String, String, String)>,
    /// Files put there and gone now (not deleted on the server).
    pub deleted: Vec<String>,
    /// Files that are not synced, with why.
    pub refused: Vec<String>,
}

/// Compares the directory with what was put there. The marker is never
/// synced; a path that is not a clean relative path is refused.
pub fn plan(baseline: &Baseline, local: &BTreeMap<String, Local>) -> Plan {
    let mut p = Plan::default();
    for (path, l) in local {
        if path == MARKER {
            continue;
        }
        if !matches!(safe_name(path), Ok(Some(ref c)) if c == path) {
            p.refused
                .push(format!("{path:?}: not a clean relative path"));
            continue;
        }
        let Some(sha) = &l.sha else {
            p.refused
                .push(format!("{path}: {} bytes, over {MAX_FILE_BYTES}", l.size));
            continue;
        };
        match baseline.get(path) {
            None => p.create.push(path.clone()),
            Some((id, base)) if base != sha => {
                p.update.push((path.clone(), id.clone(), base.clone()));
            }
            Some(_) => {}
        }
    }
    p.deleted = baseline
        .keys()
        .filter(|k| !local.contains_key(*k))
        .cloned()
        .collect();
    p
}

/// The script that lists a store's directory into a temporary file and
/// prints that file's size and path between the markers (the listing can
/// be larger than one call's output, so it is read back in slices).
///
/// Bash and coreutils only: a sandbox image has bash (the tool needs it)
/// but need not have findutils, and a `find` that is not there made an
/// empty listing, so every sync was refused for a missing marker. Bash's
/// `**` does not descend into linked directories; links are skipped.
fn manifest_script(dir: &str) -> String {
    format!(
        r#"D={d}
if [ ! -d "$D" ] || [ -L "$D" ]; then echo agentplane-dispatcher:missing; echo agentplane-dispatcher:done; exit 0; fi
t=$(mktemp 2>/dev/null || mktemp -p "$PWD")
( cd -- "$D" && shopt -s globstar dotglob nullglob && i=0 && for f in **; do
  {{ [ -f "$f" ] && [ ! -L "$f" ]; }} || continue
  i=$((i + 1)); [ "$i" -le {limit} ] || break
  n=$(wc -c < "$f")
  if [ "$n" -gt {max} ]; then s=-; else s=$(sha256sum < "$f" | cut -c1-64); fi
  printf '%s %s %s\n' "$s" "$n" "$(printf '%s' "$f" | base64 -w0)"
done ) > "$t"
echo agentplane-dispatcher:begin
printf '%s %s\n' "$(wc -c < "$t")" "$t"
echo agentplane-dispatcher:end
echo agentplane-dispatcher:done"#,
        d = quote(dir),
        limit = MAX_FILES + 2,
        max = MAX_FILE_BYTES,
    )
}

/// Puts the session's memory stores into the sandbox; the stores put, for
/// the sync at the end. Never fails the run.
pub async fn mount(
    api: &ManagedApi,
    gateway: &impl Tools,
    sandbox: &Sandbox,
    sessions_token: &str,
    work: &str,
    refs: &[StoreRef],
    directory: &str,
) -> Vec<Mounted> {
    let mut out = Vec::new();
    if refs.is_empty() {
        return out;
    }
    if !(sandbox.has("bash") || sandbox.has("write")) {
        tracing::warn!(
            work,
            "the session has neither bash nor write enabled; its memory stores are not put into the sandbox"
        );
        return out;
    }
    if !sandbox.has("bash") {
        tracing::warn!(
            work,
            "the session has bash disabled: its memory stores are put into the sandbox with write, but changes cannot be read back and are not synced"
        );
    }
    for r in refs {
        match mount_one(api, gateway, sandbox, sessions_token, r, directory).await {
            Ok((m, skipped)) => {
                for why in &skipped {
                    tracing::warn!(work, memory_store = %r.id, memory = %why, "a memory was not put into the sandbox");
                }
                if let Some(mp) = r.mount_path.as_deref().filter(|mp| *mp != m.dir) {
                    tracing::warn!(work, memory_store = %r.id, mount_path = mp, dir = %m.dir, "the memory store's mount_path cannot be used in the sandbox; it is put under the workdir instead");
                }
                tracing::info!(work, memory_store = %r.id, dir = %m.dir, memories = m.baseline.len(), "memory store put into the sandbox");
                out.push(m);
            }
            Err(e) => {
                tracing::warn!(work, memory_store = %r.id, error = %e, "cannot put the memory store into the sandbox; going on without it");
            }
        }
    }
    out
}

async fn list_all(api: &ManagedApi, token: &str, store: &str) -> Result<Vec<Memory>, String> {
    let mut all = Vec::new();
    let mut page: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let (items, next) = api
            .memories_page(token, store, page.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        let empty = items.is_empty();
        all.extend(items.into_iter().filter(|m| m.kind == "memory"));
        if all.len() > MAX_FILES {
            return Err(format!("the store has more than {MAX_FILES} memories"));
        }
        match next {
            Some(n) if !empty => page = Some(n),
            _ => return Ok(all),
        }
    }
    Err(format!(
        "the store's listing has more than {MAX_PAGES} pages"
    ))
}

async fn mount_one(
    api: &ManagedApi,
    gateway: &impl Tools,
    sandbox: &Sandbox,
    token: &str,
    r: &StoreRef,
    directory: &str,
) -> Result<(Mounted, Vec<String>), String> {
    let memories = list_all(api, token, &r.id).await?;
    let (files, baseline, skipped) = files_of(&r.id, memories);
    let mut why = Vec::new();
    for dir in candidate_dirs(r, directory) {
        if sandbox.has("bash") {
            // The directory must be new (or empty): files left there by
            // something else would be uploaded into the store.
            let check = format!(
                "D={d}\nif [ -e \"$D\" ] && [ -n \"$(ls -A -- \"$D\" 2>/dev/null || echo x)\" ]; then echo agentplane-dispatcher:exists; else mkdir -p -- \"$D\"; fi\necho agentplane-dispatcher:done",
                d = quote(&dir)
            );
            match sandbox.bash(gateway, "memory", &check).await {
                Ok(o) if o.contains("agentplane-dispatcher:exists") => {
                    why.push(format!("{dir}: something is already there"));
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    why.push(format!("{dir}: {e}"));
                    continue;
                }
            }
        }
        let mut skipped = skipped.clone();
        match sandbox.put(gateway, "memory", &dir, &files).await {
            Ok(s) => skipped.extend(s),
            Err(e) => {
                why.push(format!("{dir}: {e}"));
                continue;
            }
        }
        if r.read_only && sandbox.has("bash") {
            let lock = format!(
                "chmod -R a-w -- {}\necho agentplane-dispatcher:done",
                quote(&dir)
            );
            if let Err(e) = sandbox.bash(gateway, "memory", &lock).await {
                skipped.push(format!("cannot make the read-only store read-only: {e}"));
            }
        }
        return Ok((
            Mounted {
                store: r.clone(),
                dir,
                baseline,
            },
            skipped,
        ));
    }
    Err(why.join("; "))
}

/// What a store's sync did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Memories created.
    pub created: usize,
    /// Memories updated.
    pub updated: usize,
    /// Files deleted in the sandbox (not deleted on the server).
    pub deleted_not_synced: usize,
    /// Files not synced, with why.
    pub failed: Vec<String>,
}

/// Syncs every writable mounted store back. Never fails the run.
pub async fn sync(
    api: &ManagedApi,
    gateway: &impl Tools,
    sandbox: &Sandbox,
    sessions_token: &str,
    work: &str,
    mounted: &[Mounted],
) {
    for m in mounted {
        if m.store.read_only {
            continue;
        }
        if !sandbox.has("bash") {
            tracing::warn!(work, memory_store = %m.store.id, "bash is disabled: the memory store's changes cannot be read back and are not synced");
            continue;
        }
        match sync_one(api, gateway, sandbox, sessions_token, m).await {
            Ok(s) => {
                for why in &s.failed {
                    tracing::warn!(work, memory_store = %m.store.id, memory = %why, "a memory was not synced back");
                }
                if s.deleted_not_synced > 0 {
                    tracing::info!(work, memory_store = %m.store.id, count = s.deleted_not_synced, "files deleted in the sandbox are not deleted in the memory store (deletions are not synced)");
                }
                tracing::info!(work, memory_store = %m.store.id, created = s.created, updated = s.updated, "memory store synced back");
            }
            Err(e) => {
                tracing::warn!(work, memory_store = %m.store.id, error = %e, "cannot sync the memory store back; its changes in this run are not saved");
            }
        }
    }
}

async fn sync_one(
    api: &ManagedApi,
    gateway: &impl Tools,
    sandbox: &Sandbox,
    token: &str,
    m: &Mounted,
) -> Result<Synced, String> {
    let out = sandbox
        .bash(gateway, "memory", &manifest_script(&m.dir))
        .await?;
    if out.contains("agentplane-dispatcher:missing") {
        return Err(format!("{} is gone or not a directory", m.dir));
    }
    let head = crate::files::between_markers(&out)
        .ok_or("the listing printed no size and path")?
        .trim()
        .to_owned();
    let (size, tmp) = head
        .split_once(' ')
        .ok_or_else(|| format!("the listing printed {head:?}"))?;
    let size: usize = size
        .parse()
        .map_err(|_| format!("the listing printed {head:?}"))?;
    // A listing of MAX_FILES lines, each at most ~1.5 KiB.
    if size > (MAX_FILES + 2) * 1600 {
        return Err(format!("the listing is {size} bytes"));
    }
    let listing = sandbox.get(gateway, "memory", tmp, size).await;
    let _ = sandbox
        .bash(
            gateway,
            "memory",
            &format!("rm -f -- {}\necho agentplane-dispatcher:done", quote(tmp)),
        )
        .await;
    let listing = String::from_utf8(listing?).map_err(|_| "the listing is not UTF-8")?;
    let local = parse_manifest(&listing)?;
    let marker_ok = local
        .get(MARKER)
        .and_then(|l| l.sha.as_deref())
        .is_some_and(|s| s == sha_hex(marker_text(&m.store.id).as_bytes()));
    if !marker_ok {
        let listed: Vec<&str> = local.keys().take(8).map(String::as_str).collect();
        let why = if local.contains_key(MARKER) {
            "names another store"
        } else {
            "is gone"
        };
        return Err(format!(
            "the marker file {MARKER} {why} (the directory {} lists {} files: {listed:?}); it is left as found and not synced",
            m.dir,
            local.len()
        ));
    }
    let p = plan(&m.baseline, &local);
    let mut s = Synced {
        deleted_not_synced: p.deleted.len(),
        failed: p.refused,
        ..Synced::default()
    };
    let mut budget = MAX_READ_BACK;
    let wanted = p.create.iter().map(|c| (c.clone(), None)).chain(
        p.update
            .iter()
            .map(|(c, id, sha)| (c.clone(), Some((id.clone(), sha.clone())))),
    );
    for (path, existing) in wanted {
        let Some(l) = local.get(&path) else { continue };
        if l.size > budget {
            s.failed.push(format!(
                "{path}: over the {MAX_READ_BACK}-byte read-back budget"
            ));
            continue;
        }
        budget -= l.size;
        let data = match sandbox
            .get(gateway, "memory", &join(&m.dir, &path), l.size)
            .await
        {
            Ok(d) => d,
            Err(e) => {
                s.failed.push(format!("{path}: {e}"));
                continue;
            }
        };
        if Some(sha_hex(&data)) != l.sha {
            s.failed.push(format!("{path}: changed while it was read"));
            continue;
        }
        let Ok(content) = String::from_utf8(data) else {
            s.failed
                .push(format!("{path}: not UTF-8 (memories are text)"));
            continue;
        };
        let r = match &existing {
            Some((id, base)) => {
                match api
                    .memory_update(token, &m.store.id, id, &content, base)
                    .await
                {
                    Err(e) if e.status() == Some(404) => api
                        .memory_create(token, &m.store.id, &format!("/{path}"), &content)
                        .await
                        .map(|_| false),
                    r => r.map(|_| true),
                }
            }
            None => api
                .memory_create(token, &m.store.id, &format!("/{path}"), &content)
                .await
                .map(|_| false),
        };
        match r {
            Ok(true) => s.updated += 1,
            Ok(false) => s.created += 1,
            Err(e) if e.status() == Some(409) => s.failed.push(format!(
                "{path}: changed in the store during the run; the store's version is kept ({e})"
            )),
            Err(e) => s.failed.push(format!("{path}: {e}")),
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mem(id: &str, path: &str, content: &str) -> Memory {
        serde_json::from_value(json!({"id": id, "type": "memory", "path": path,
            "content_sha256": sha_hex(content.as_bytes()), "content": content}))
        .unwrap()
    }

    #[test]
    fn stores_come_from_the_sessions_resources() {
        let r = stores(&[
            json!({"type": "file", "file_id": "f"}),
            json!({"type": "memory_store", "memory_store_id": "memstore_1", "name": "notes", "access": "read_write"}),
            json!({"type": "memory_store", "memory_store_id": "memstore_2", "access": "read_only", "mount_path": "/mnt/memory/x"}),
            json!({"type": "memory_store"}),
        ]);
        assert_eq!(r.len(), 2);
        assert_eq!(candidate_dirs(&r[0], "memory"), vec!["memory/notes"]);
        assert!(r[1].read_only);
        assert_eq!(
            candidate_dirs(&r[1], "memory"),
            vec!["/mnt/memory/x", "memory/memstore_2"]
        );
        // A mount path or directory that is not clean is not used.
        let mut bad = r[1].clone();
        bad.mount_path = Some("/mnt/../etc".into());
        bad.name = Some("../up".into());
        assert_eq!(candidate_dirs(&bad, "../x"), vec!["memory/up"]);
    }

    #[test]
    fn memories_become_files_with_the_marker() {
        let (files, base, skipped) = files_of(
            "memstore_1",
            vec![
                mem("mem_1", "/preferences.md", "colour: blue\n"),
                mem("mem_2", "/a/b.md", "x"),
                mem("mem_3", "/../escape", "evil"),
                mem("mem_4", "/.anthropic-memory-store", "forged"),
            ],
        );
        assert_eq!(files[0].path, MARKER);
        assert_eq!(files[0].data, b"version 1\nmemstore_1");
        assert_eq!(
            files[1..]
                .iter()
                .map(|f| f.path.as_str())
                .collect::<Vec<_>>(),
            vec!["preferences.md", "a/b.md"]
        );
        assert_eq!(base["preferences.md"].0, "mem_1");
        assert_eq!(base["preferences.md"].1, sha_hex(b"colour: blue\n"));
        assert_eq!(skipped.len(), 2, "{skipped:?}");
    }

    #[test]
    fn the_listing_is_parsed_and_bounded() {
        use base64::Engine;
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let sha = sha_hex(b"x");
        let text = format!("{sha} 1 {}\n- 2000000 {}\n", b("a b/c.md"), b("big"));
        let l = parse_manifest(&text).unwrap();
        assert_eq!(
            l["a b/c.md"],
            Local {
                sha: Some(sha.clone()),
                size: 1
            }
        );
        assert_eq!(l["big"].sha, None);
        assert!(parse_manifest("zz 1 YQ==").is_err());
        assert!(parse_manifest(&format!("{sha} x YQ==")).is_err());
        let many: String = (0..=MAX_FILES + 1)
            .map(|i| format!("{sha} 1 {}\n", b(&format!("f{i}"))))
            .collect();
        assert!(parse_manifest(&many).unwrap_err().contains("more than"));
    }

    #[test]
    fn the_sync_creates_new_files_updates_changed_ones_and_deletes_nothing() {
        let base: BTreeMap<String, (String, String)> = [
            ("same.md", "mem_1", sha_hex(b"same")),
            ("changed.md", "mem_2", sha_hex(b"old")),
            ("gone.md", "mem_3", sha_hex(b"gone")),
        ]
        .into_iter()
        .map(|(p, i, s)| (p.to_owned(), (i.to_owned(), s)))
        .collect();
        let local: BTreeMap<String, Local> = [
            (MARKER, Some(sha_hex(marker_text("m").as_bytes())), 12),
            ("same.md", Some(sha_hex(b"same")), 4),
            ("changed.md", Some(sha_hex(b"new")), 3),
            ("new.md", Some(sha_hex(b"n")), 1),
            ("huge.md", None, 5_000_000),
            ("a/../b", Some(sha_hex(b"n")), 1),
        ]
        .into_iter()
        .map(|(p, sha, size)| (p.to_owned(), Local { sha, size }))
        .collect();
        let p = plan(&base, &local);
        assert_eq!(p.create, vec!["new.md"]);
        assert_eq!(
            p.update,
            vec![("changed.md".to_owned(), "mem_2".to_owned(), sha_hex(b"old"))]
        );
        assert_eq!(p.deleted, vec!["gone.md"]);
        assert_eq!(p.refused.len(), 2, "{:?}", p.refused);
    }

    #[test]
    fn the_listing_script_lists_regular_files_only() {
        let tmp = std::env::temp_dir().join(format!("dispatcher-mem-{}", fastrand::u64(..)));
        let store = tmp.join("memory/notes");
        std::fs::create_dir_all(store.join("sub dir")).unwrap();
        std::fs::write(store.join(MARKER), marker_text("memstore_1")).unwrap();
        std::fs::write(store.join("sub dir/it's.md"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", store.join("link")).unwrap();
        std::fs::create_dir_all(store.join("deep/er")).unwrap();
        std::fs::write(store.join("deep/er/.hidden.md"), "y").unwrap();
        std::os::unix::fs::symlink(store.join("deep"), store.join("linked-dir")).unwrap();
        // Only what the sandbox image holds (bash and coreutils; no find):
        // the listing must not need more.
        let bin = tmp.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for tool in ["mktemp", "wc", "sha256sum", "cut", "base64", "head", "tail"] {
            let found = ["/usr/bin", "/bin"]
                .iter()
                .map(|d| std::path::Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{tool} is not installed here"));
            std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
        }
        let out = std::process::Command::new("/bin/bash")
            .arg("-c")
            .arg(format!(
                "(\nset -e\ncd -- {}\n{}\n)",
                quote(tmp.to_str().unwrap()),
                manifest_script("memory/notes")
            ))
            .env("PATH", &bin)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let head = crate::files::between_markers(&text)
            .expect(&text)
            .to_owned();
        let (_, path) = head.split_once(' ').unwrap();
        let l = parse_manifest(&std::fs::read_to_string(path).unwrap()).unwrap();
        std::fs::remove_file(path).unwrap();
        assert_eq!(
            l.keys().map(String::as_str).collect::<Vec<_>>(),
            vec![MARKER, "deep/er/.hidden.md", "sub dir/it's.md"],
            "{text}"
        );
        assert_eq!(
            l[MARKER].sha,
            Some(sha_hex(marker_text("memstore_1").as_bytes()))
        );
        assert_eq!(l["sub dir/it's.md"].sha, Some(sha_hex(b"x")));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
