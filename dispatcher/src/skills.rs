//! The session agent's skills, put into its sandbox before any tool runs,
//! as the official worker puts them into its workdir: for each of
//! `agent.skills`, `GET /v1/skills/{id}/versions/{version}` (`latest`
//! resolves to a concrete id), then that version's archive
//! (`…/content`, `Accept: application/binary`; both with no
//! `anthropic-beta`), unpacked into `{workdir}/skills/<name>/` with its one
//! wrapper directory stripped.
//!
//! Skills can be third-party, so the archive is unpacked here, in the
//! dispatcher, under limits and checks, and only its regular files go into
//! the sandbox (through the gateway, see [`crate::files`]): an absolute
//! entry or one with a `..` component refuses the whole archive; a
//! symlink, hard link, device, FIFO or socket entry is left out with a
//! warning; more than [`MAX_ENTRIES`] entries, more than [`MAX_UNPACKED`]
//! bytes unpacked or an archive over [`MAX_ARCHIVE`] bytes is refused.
//! A skill that fails is logged and the others go on.

use std::collections::BTreeMap;
use std::io::{Cursor, Read};

use serde_json::Value;

use crate::api::ManagedApi;
use crate::files::{PutFile, Sandbox, Tools, quote};

/// The largest archive downloaded.
pub const MAX_ARCHIVE: usize = 32 << 20;
/// The most entries an archive may have.
pub const MAX_ENTRIES: usize = 10_000;
/// The most bytes an archive may unpack to, all files together.
pub const MAX_UNPACKED: u64 = 64 << 20;
/// The most skills put into one sandbox.
pub const MAX_SKILLS: usize = 64;
/// Where skills go, under the workdir.
pub const SKILLS_DIR: &str = "skills";

/// What an archive unpacked to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Its regular files, the wrapper directory stripped, in archive order
    /// (a later entry of the same path replaces an earlier one).
    pub files: Vec<PutFile>,
    /// Entries left out, each with why (links, devices).
    pub skipped: Vec<String>,
}

/// `name` as a relative path of plain components: `.` and empty
/// components dropped, `\` read as `/`; an absolute name, a drive letter,
/// a `..` component or a control character is refused. `Ok(None)` for a
/// name of nothing (`./`).
pub fn safe_name(name: &str) -> Result<Option<String>, String> {
    let norm = name.replace('\\', "/");
    let bytes = norm.as_bytes();
    if norm.starts_with('/')
        || (bytes.len() >= 2 && bytes[1] == b':' && bytes[0].is_ascii_alphabetic())
    {
        return Err(format!("refusing an entry with an absolute path: {name:?}"));
    }
    if norm.chars().any(char::is_control) {
        return Err(format!(
            "refusing an entry whose name has a control character: {name:?}"
        ));
    }
    let parts: Vec<&str> = norm
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(format!("refusing an entry with a '..' component: {name:?}"));
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// The one top-level directory every entry shares, when there is one and
/// something is nested in it (the SDK's rule): skill bundles come wrapped
/// in a directory named after the skill.
fn wrapper(names: &[String]) -> Option<String> {
    let mut top: Option<&str> = None;
    let mut nested = false;
    for n in names {
        let (first, rest) = match n.split_once('/') {
            Some((f, r)) => (f, Some(r)),
            None => (n.as_str(), None),
        };
        nested |= rest.is_some();
        match top {
            None => top = Some(first),
            Some(t) if t == first => {}
            Some(_) => return None,
        }
    }
    top.filter(|_| nested).map(str::to_owned)
}

fn strip(path: &str, top: Option<&str>) -> Option<String> {
    match top {
        Some(t) if path == t => None,
        Some(t) => Some(
            path.strip_prefix(t)
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or(path)
                .to_owned(),
        ),
        None => Some(path.to_owned()),
    }
}

/// One entry, before the wrapper is known.
struct Raw {
    path: String,
    dir: bool,
    data: Vec<u8>,
    executable: bool,
}

/// Unpacks a zip, tar or gzip'd tar under the limits above.
pub fn unpack(archive: &[u8]) -> Result<Unpacked, String> {
    if archive.len() > MAX_ARCHIVE {
        return Err(format!(
            "the archive is {} bytes, over the limit of {MAX_ARCHIVE}",
            archive.len()
        ));
    }
    let mut skipped = Vec::new();
    let raws = if archive.starts_with(b"PK\x03\x04") || archive.starts_with(b"PK\x05\x06") {
        unzip(archive, &mut skipped)?
    } else if archive.starts_with(&[0x1f, 0x8b]) {
        let gz = flate2::read::GzDecoder::new(archive);
        untar(gz, &mut skipped)?
    } else if archive.len() > 262 && &archive[257..262] == b"ustar" {
        untar(archive, &mut skipped)?
    } else {
        return Err("the archive is neither a zip nor a tar".into());
    };
    let names: Vec<String> = raws.iter().map(|r| r.path.clone()).collect();
    let top = wrapper(&names);
    let mut files: Vec<PutFile> = Vec::new();
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    for r in raws {
        let Some(path) = strip(&r.path, top.as_deref()) else {
            continue;
        };
        if r.dir {
            continue;
        }
        let f = PutFile {
            path: path.clone(),
            data: r.data,
            executable: r.executable,
        };
        match at.get(&path) {
            Some(&i) => files[i] = f,
            None => {
                at.insert(path, files.len());
                files.push(f);
            }
        }
    }
    // A file where another entry needs a directory cannot be put.
    for p in at.keys() {
        let mut prefix = p.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if at.contains_key(parent) {
                return Err(format!(
                    "refusing an archive where {parent:?} is both a file and a directory"
                ));
            }
            prefix = parent;
        }
    }
    Ok(Unpacked { files, skipped })
}

const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;

fn special_kind(mode: u32) -> Option<&'static str> {
    match mode & S_IFMT {
        0 | S_IFREG | S_IFDIR => None,
        0o120_000 => Some("a symlink"),
        0o020_000 => Some("a character device"),
        0o060_000 => Some("a block device"),
        0o010_000 => Some("a FIFO"),
        0o140_000 => Some("a socket"),
        _ => Some("not a regular file"),
    }
}

/// Reads at most what is left of the budget, refusing more.
fn read_bounded(r: &mut impl Read, left: &mut u64, name: &str) -> Result<Vec<u8>, String> {
    let mut data = Vec::new();
    r.take(*left + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("reading {name:?}: {e}"))?;
    if data.len() as u64 > *left {
        return Err(format!(
            "the archive unpacks to more than {MAX_UNPACKED} bytes"
        ));
    }
    *left -= data.len() as u64;
    Ok(data)
}

fn unzip(archive: &[u8], skipped: &mut Vec<String>) -> Result<Vec<Raw>, String> {
    let mut z = zip::ZipArchive::new(Cursor::new(archive))
        .map_err(|e| format!("not a readable zip: {e}"))?;
    if z.len() > MAX_ENTRIES {
        return Err(format!(
            "the archive has {} entries, over the limit of {MAX_ENTRIES}",
            z.len()
        ));
    }
    // Every name is checked first, extracted or not (as the SDK does).
    let mut out = Vec::new();
    let mut left = MAX_UNPACKED;
    for i in 0..z.len() {
        let mut f = z.by_index(i).map_err(|e| format!("zip entry {i}: {e}"))?;
        let name = String::from_utf8_lossy(f.name_raw()).into_owned();
        let Some(path) = safe_name(&name)? else {
            continue;
        };
        let mode = f.unix_mode().unwrap_or(0);
        if let Some(kind) = special_kind(mode) {
            skipped.push(format!("{name:?} is {kind}; left out"));
            continue;
        }
        let dir = f.is_dir() || mode & S_IFMT == S_IFDIR;
        let data = if dir {
            Vec::new()
        } else {
            read_bounded(&mut f, &mut left, &name)?
        };
        out.push(Raw {
            path,
            dir,
            data,
            executable: mode & 0o111 != 0,
        });
    }
    Ok(out)
}

fn untar(r: impl Read, skipped: &mut Vec<String>) -> Result<Vec<Raw>, String> {
    let mut t = tar::Archive::new(r);
    let mut out = Vec::new();
    let mut left = MAX_UNPACKED;
    let entries = t
        .entries()
        .map_err(|e| format!("not a readable tar: {e}"))?;
    for (n, e) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(format!("the archive has more than {MAX_ENTRIES} entries"));
        }
        let mut e = e.map_err(|e| format!("tar entry {n}: {e}"))?;
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let Some(path) = safe_name(&name)? else {
            continue;
        };
        let kind = e.header().entry_type();
        let dir = kind.is_dir();
        if !(dir || kind.is_file()) {
            let what = if kind.is_symlink() {
                "a symlink"
            } else if kind.is_hard_link() {
                "a hard link"
            } else if kind.is_character_special() {
                "a character device"
            } else if kind.is_block_special() {
                "a block device"
            } else if kind.is_fifo() {
                "a FIFO"
            } else {
                "not a regular file"
            };
            skipped.push(format!("{name:?} is {what}; left out"));
            continue;
        }
        let mode = e.header().mode().unwrap_or(0o644);
        let data = if dir {
            Vec::new()
        } else {
            read_bounded(&mut e, &mut left, &name)?
        };
        out.push(Raw {
            path,
            dir,
            data,
            executable: mode & 0o111 != 0,
        });
    }
    Ok(out)
}

/// The directory a skill gets: its name reduced to one plain component,
/// or its id when the name gives none.
pub fn dir_name(name: &str, skill_id: &str) -> String {
    let base = name.trim().rsplit(['/', '\\']).next().unwrap_or("").trim();
    let ok = !base.is_empty()
        && base != "."
        && base != ".."
        && !base.starts_with('.')
        && !base.chars().any(char::is_control);
    if ok {
        base.to_owned()
    } else {
        skill_id.to_owned()
    }
}

/// Puts the session agent's skills into the sandbox. Never fails the
/// run: each skill that cannot be put is logged. Returns the directories
/// put (relative to the workdir).
pub async fn install(
    api: &ManagedApi,
    gateway: &impl Tools,
    sandbox: &Sandbox,
    bearer: &str,
    work: &str,
    skills: &[Value],
) -> Vec<String> {
    let mut done = Vec::new();
    if skills.is_empty() {
        return done;
    }
    if !(sandbox.has("bash") || sandbox.has("write")) {
        tracing::warn!(
            work,
            "the session has neither bash nor write enabled; its skills are not put into the sandbox"
        );
        return done;
    }
    if skills.len() > MAX_SKILLS {
        tracing::warn!(
            work,
            count = skills.len(),
            "more than {MAX_SKILLS} skills; only the first {MAX_SKILLS} are put into the sandbox"
        );
    }
    for s in skills.iter().take(MAX_SKILLS) {
        let id = s.get("skill_id").and_then(Value::as_str).unwrap_or("");
        let version = s.get("version").and_then(Value::as_str).unwrap_or("latest");
        match install_one(api, gateway, sandbox, bearer, id, version).await {
            Ok((dir, skipped)) => {
                for why in &skipped {
                    tracing::warn!(work, skill = id, entry = %why, "a skill archive entry was refused");
                }
                tracing::info!(work, skill = id, dir = %dir, "skill put into the sandbox");
                done.push(dir);
            }
            Err(e) => {
                tracing::warn!(work, skill = id, error = %e, "cannot put the skill into the sandbox; going on without it");
            }
        }
    }
    done
}

async fn install_one(
    api: &ManagedApi,
    gateway: &impl Tools,
    sandbox: &Sandbox,
    bearer: &str,
    id: &str,
    version: &str,
) -> Result<(String, Vec<String>), String> {
    let v = api
        .skill_version(bearer, id, version)
        .await
        .map_err(|e| e.to_string())?;
    let archive = api
        .skill_content(bearer, id, &v.id, MAX_ARCHIVE)
        .await
        .map_err(|e| e.to_string())?;
    let unpacked = unpack(&archive)?;
    let name = dir_name(&v.name, id);
    let dest = format!("{SKILLS_DIR}/{name}");
    let mut skipped = unpacked.skipped;
    if sandbox.has("bash") {
        // Staged beside its destination, then swapped in: a skill is there
        // whole or not at all, and one put again replaces the old.
        let stage = format!("{SKILLS_DIR}/.{name}.partial");
        sandbox
            .bash(
                gateway,
                "skill",
                &format!(
                    "rm -rf -- {s}\nmkdir -p -- {s}\nchmod 0700 -- {}\necho agentplane-dispatcher:done",
                    quote(SKILLS_DIR),
                    s = quote(&stage)
                ),
            )
            .await?;
        sandbox
            .put(gateway, "skill", &stage, &unpacked.files)
            .await?;
        sandbox
            .bash(
                gateway,
                "skill",
                &format!(
                    "rm -rf -- {d}\nmv -- {} {d}\necho agentplane-dispatcher:done",
                    quote(&stage),
                    d = quote(&dest)
                ),
            )
            .await?;
    } else {
        skipped.extend(
            sandbox
                .put(gateway, "skill", &dest, &unpacked.files)
                .await?,
        );
    }
    Ok((dest, skipped))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use zip::write::SimpleFileOptions;

    use super::*;

    fn zip_of(entries: &[(&str, &[u8], Option<u32>)]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, data, mode) in entries {
            let mut o =
                SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
            if let Some(m) = mode {
                o = o.external_attributes(m << 16);
            }
            w.start_file(*name, o).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    #[test]
    fn names_that_leave_their_directory_are_refused() {
        assert_eq!(safe_name("a/./b//c").unwrap().as_deref(), Some("a/b/c"));
        assert_eq!(safe_name("./").unwrap(), None);
        assert_eq!(safe_name("a\\b").unwrap().as_deref(), Some("a/b"));
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/..",
            "C:/x",
            "\\x",
            "a\nb",
        ] {
            assert!(safe_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_skill_zip_loses_its_wrapper_and_keeps_exec_bits() {
        let z = zip_of(&[
            ("hello/SKILL.md", b"body", Some(0o100_644)),
            ("hello/scripts/hi.sh", b"echo hi", Some(0o100_755)),
        ]);
        let u = unpack(&z).unwrap();
        assert_eq!(u.skipped, Vec::<String>::new());
        let got: Vec<(&str, &[u8], bool)> = u
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.data.as_slice(), f.executable))
            .collect();
        assert_eq!(
            got,
            vec![
                ("SKILL.md", &b"body"[..], false),
                ("scripts/hi.sh", &b"echo hi"[..], true)
            ]
        );
        // No common wrapper: nothing is stripped.
        let z = zip_of(&[("a.md", b"1", None), ("b/c.md", b"2", None)]);
        let paths: Vec<String> = unpack(&z)
            .unwrap()
            .files
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(paths, vec!["a.md", "b/c.md"]);
    }

    #[test]
    fn hostile_zips_are_refused() {
        for name in ["../x", "skill/../../x", "/etc/cron.d/x"] {
            let z = zip_of(&[("skill/ok.md", b"ok", None), (name, b"evil", None)]);
            let e = unpack(&z).unwrap_err();
            assert!(e.contains("refusing"), "{name}: {e}");
        }
        // Links and devices are left out, by name.
        let z = zip_of(&[
            ("s/ok.md", b"ok", Some(0o100_644)),
            ("s/link", b"/etc/shadow", Some(0o120_777)),
            ("s/tty", b"", Some(0o020_666)),
            ("s/fifo", b"", Some(0o010_644)),
        ]);
        let u = unpack(&z).unwrap();
        assert_eq!(u.files.len(), 1);
        assert_eq!(u.files[0].path, "ok.md");
        assert_eq!(u.skipped.len(), 3, "{:?}", u.skipped);
        assert!(u.skipped[0].contains("symlink"), "{:?}", u.skipped);
        assert!(u.skipped[1].contains("character device"), "{:?}", u.skipped);
    }

    #[test]
    fn archives_past_the_limits_are_refused() {
        let many: Vec<(String, Vec<u8>)> = (0..=MAX_ENTRIES)
            .map(|i| (format!("s/{i}"), Vec::new()))
            .collect();
        let refs: Vec<(&str, &[u8], Option<u32>)> = many
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice(), None))
            .collect();
        let e = unpack(&zip_of(&refs)).unwrap_err();
        assert!(e.contains("entries"), "{e}");

        // A deflated bomb: small archive, too much unpacked.
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let o = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        let zeros = vec![0u8; 1 << 20];
        for i in 0..65 {
            w.start_file(format!("s/{i}"), o).unwrap();
            w.write_all(&zeros).unwrap();
        }
        let bomb = w.finish().unwrap().into_inner();
        assert!(bomb.len() < MAX_ARCHIVE);
        let e = unpack(&bomb).unwrap_err();
        assert!(e.contains("more than"), "{e}");

        let e = unpack(&vec![0u8; MAX_ARCHIVE + 1]).unwrap_err();
        assert!(e.contains("over the limit"), "{e}");
        assert!(unpack(b"not an archive").is_err());
    }

    fn tar_of(entries: &[(&str, &[u8], tar::EntryType)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data, kind) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            // set_path refuses `..`; write the name raw, as an attacker would.
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            if kind.is_symlink() {
                h.set_link_name("/etc/shadow").unwrap();
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn tars_are_checked_alike() {
        let t = tar_of(&[
            ("s/run.sh", b"echo", tar::EntryType::Regular),
            ("s/l", b"", tar::EntryType::Symlink),
        ]);
        let u = unpack(&t).unwrap();
        assert_eq!(u.files.len(), 1);
        assert_eq!(u.files[0].path, "run.sh");
        assert!(u.files[0].executable);
        assert!(u.skipped[0].contains("symlink"));
        let t = tar_of(&[("s/../../x", b"evil", tar::EntryType::Regular)]);
        assert!(unpack(&t).unwrap_err().contains(".."));
        // Gzip'd.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar_of(&[
            ("s/a", b"x", tar::EntryType::Regular),
            ("s/b/c", b"y", tar::EntryType::Regular),
        ]))
        .unwrap();
        let u = unpack(&gz.finish().unwrap()).unwrap();
        assert_eq!(
            u.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            vec!["a", "b/c"]
        );
    }

    #[test]
    fn a_file_where_a_directory_must_be_is_refused() {
        let z = zip_of(&[("s/a", b"1", None), ("s/a/b", b"2", None)]);
        assert!(
            unpack(&z)
                .unwrap_err()
                .contains("both a file and a directory")
        );
    }

    #[test]
    fn skill_directories_are_one_plain_component() {
        assert_eq!(dir_name("hello-skill", "skill_1"), "hello-skill");
        assert_eq!(dir_name(" a/b ", "skill_1"), "b");
        for bad in ["", "..", ".", "x/..", ".hidden", "a\nb"] {
            assert_eq!(dir_name(bad, "skill_1"), "skill_1", "{bad:?}");
        }
    }
}
