//! Import circles among a crate's files.

use std::collections::BTreeMap;

use crate::{Crate, ModPath};

/// Every import circle among `krate`'s files, each as its files in order
/// files and one loop through them with the line of each import
/// (`{a.rs, b.rs}, e.g. a.rs (line 3) -> b.rs (line 12) -> a.rs`).
///
/// A circle is a strongly connected set of more than one file (Tarjan's
/// algorithm, iterative so a deep crate cannot overflow the stack); each
/// is shown as one concrete loop through it.
pub fn cycles(krate: &Crate) -> Vec<String> {
    let nodes: Vec<&ModPath> = krate.files.keys().collect();
    let index: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let edges: Vec<Vec<(usize, usize)>> = nodes
        .iter()
        .map(|m| {
            let mut out: Vec<(usize, usize)> = krate.files[*m]
                .imports
                .iter()
                .filter_map(|imp| index.get(&imp.target).map(|&t| (t, imp.line)))
                .filter(|&(t, _)| nodes[t] != *m)
                .collect();
            out.sort();
            out.dedup_by_key(|e| e.0);
            out
        })
        .collect();
    strongly_connected(&edges)
        .into_iter()
        .filter(|scc| scc.len() > 1)
        .map(|scc| show_loop(krate, &nodes, &edges, &scc))
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected(edges: &[Vec<(usize, usize)>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut out = Vec::new();
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, position in its edge list)
        let mut work = vec![(root, 0usize)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut pos)) = work.last_mut() {
            if let Some(&(w, _)) = edges[v].get(*pos) {
                *pos += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut scc = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                scc.sort();
                out.push(scc);
            }
        }
    }
    out
}

/// One loop through `scc`, from its first file back to it (a shortest one,
/// by breadth-first search inside the component).
fn show_loop(
    krate: &Crate,
    nodes: &[&ModPath],
    edges: &[Vec<(usize, usize)>],
    scc: &[usize],
) -> String {
    let start = scc[0];
    let mut came: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut closing = None;
    'search: while let Some(v) = queue.pop_front() {
        for &(w, line) in &edges[v] {
            if !scc.contains(&w) {
                continue;
            }
            if w == start {
                closing = Some((v, line));
                break 'search;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came.entry(w) {
                e.insert((v, line));
                queue.push_back(w);
            }
        }
    }
    let Some((last, last_line)) = closing else {
        return scc
            .iter()
            .map(|&i| krate.path_of(nodes[i]))
            .collect::<Vec<_>>()
            .join(", ");
    };
    let mut chain = vec![(last, last_line)];
    let mut at = last;
    while at != start {
        let Some(&(prev, line)) = came.get(&at) else {
            break;
        };
        chain.push((prev, line));
        at = prev;
    }
    chain.reverse();
    // chain: (file, line of its import of the next file)
    let members: Vec<String> = scc.iter().map(|&i| krate.path_of(nodes[i])).collect();
    let mut text = format!("{{{}}}, e.g. ", members.join(", "));
    for (file, line) in &chain {
        text.push_str(&format!(
            "{} (line {line}) -> ",
            krate.path_of(nodes[*file])
        ));
    }
    text.push_str(&krate.path_of(nodes[start]));
    text
}
