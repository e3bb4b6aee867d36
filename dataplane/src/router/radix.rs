//! A compressed radix tree over path prefixes.
//!
//! Every node that ends a prefix carries the candidate routes of that prefix. A lookup walks
//! the request path once, remembering the deepest node with candidates; shallower matches are
//! reached through `parent` links computed at build time, so yielding every matching prefix
//! longest-first needs no allocation and no second walk.

/// Index of a node in [`RadixTree::nodes`].
type NodeId = u32;

/// The root node; its label is empty.
const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    /// Edge label from the parent to this node.
    label: Box<[u8]>,
    /// Children sorted by the first byte of their label (labels of siblings never share it).
    children: Vec<(u8, NodeId)>,
    /// Candidate route indices for the prefix ending at this node, in match order.
    candidates: Vec<u32>,
    /// Nearest strict ancestor with candidates.
    parent: Option<NodeId>,
}

/// Maps path prefixes to ordered candidate lists; see the module docs.
#[derive(Debug)]
pub(crate) struct RadixTree {
    nodes: Vec<Node>,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
        }
    }
}

impl RadixTree {
    /// Adds `candidate` to the list of `prefix`.
    pub(crate) fn insert(&mut self, prefix: &[u8], candidate: u32) {
        let mut node = ROOT;
        let mut rest = prefix;
        loop {
            let Some(&first) = rest.first() else {
                self.node_mut(node).candidates.push(candidate);
                return;
            };
            let slot = self
                .node(node)
                .children
                .binary_search_by_key(&first, |&(b, _)| b);
            let child = match slot {
                Ok(i) => self.node(node).children[i].1,
                Err(i) => {
                    let leaf = self.push(Node {
                        label: rest.into(),
                        candidates: vec![candidate],
                        ..Node::default()
                    });
                    self.node_mut(node).children.insert(i, (first, leaf));
                    return;
                }
            };
            let label = &self.node(child).label;
            let common = label.iter().zip(rest).take_while(|(a, b)| a == b).count();
            if common == label.len() {
                node = child;
                rest = &rest[common..];
                continue;
            }
            // Split `child` at `common`: a new middle node takes the shared part of the label.
            let (head, tail): (Box<[u8]>, Box<[u8]>) =
                (label[..common].into(), label[common..].into());
            let tail_first = tail[0];
            self.node_mut(child).label = tail;
            let mid = self.push(Node {
                label: head,
                children: vec![(tail_first, child)],
                ..Node::default()
            });
            if let Ok(i) = self
                .node(node)
                .children
                .binary_search_by_key(&first, |&(b, _)| b)
            {
                self.node_mut(node).children[i].1 = mid;
            }
            node = mid;
            rest = &rest[common..];
        }
    }

    /// Orders every candidate list with `order` (and removes duplicates) and links each node
    /// to its nearest ancestor with candidates. Call once after the last insert.
    pub(crate) fn finish(&mut self, mut order: impl FnMut(&mut Vec<u32>)) {
        for node in &mut self.nodes {
            order(&mut node.candidates);
            node.candidates.shrink_to_fit();
            node.children.shrink_to_fit();
        }
        // Depth-first from the root, carrying the nearest ancestor that has candidates.
        let mut stack: Vec<(NodeId, Option<NodeId>)> = vec![(ROOT, None)];
        while let Some((id, parent)) = stack.pop() {
            let node = self.node_mut(id);
            node.parent = parent;
            let below = if node.candidates.is_empty() {
                parent
            } else {
                Some(id)
            };
            for &(_, child) in &self.node(id).children {
                stack.push((child, below));
            }
        }
    }

    /// Candidate lists of every prefix of `path`, longest prefix first.
    pub(crate) fn matches<'t>(&'t self, path: &[u8]) -> Matches<'t> {
        let mut node = ROOT;
        let mut rest = path;
        let mut deepest = None;
        loop {
            let n = self.node(node);
            if !n.candidates.is_empty() {
                deepest = Some(node);
            }
            let Some(&first) = rest.first() else { break };
            let Ok(i) = n.children.binary_search_by_key(&first, |&(b, _)| b) else {
                break;
            };
            let child = n.children[i].1;
            let label = &self.node(child).label;
            if !rest.starts_with(label) {
                break;
            }
            rest = &rest[label.len()..];
            node = child;
        }
        Matches {
            tree: self,
            next: deepest,
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    fn push(&mut self, node: Node) -> NodeId {
        // NB: a u32 node id is plenty: nodes are bounded by the number of route paths, and
        // `Router::new` refuses more than u32::MAX routes.
        let id = NodeId::try_from(self.nodes.len()).unwrap_or(NodeId::MAX);
        self.nodes.push(node);
        id
    }
}

/// Iterator over candidate lists, longest matching prefix first.
pub(crate) struct Matches<'t> {
    tree: &'t RadixTree,
    next: Option<NodeId>,
}

impl<'t> Iterator for Matches<'t> {
    type Item = &'t [u32];

    fn next(&mut self) -> Option<&'t [u32]> {
        let node = self.tree.node(self.next?);
        self.next = node.parent;
        Some(&node.candidates)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn tree(prefixes: &[&str]) -> RadixTree {
        let mut t = RadixTree::default();
        for (i, p) in prefixes.iter().enumerate() {
            t.insert(p.as_bytes(), i as u32);
        }
        t.finish(|v| v.sort_unstable());
        t
    }

    fn hits(t: &RadixTree, path: &str) -> Vec<Vec<u32>> {
        t.matches(path.as_bytes()).map(<[u32]>::to_vec).collect()
    }

    #[test]
    fn yields_every_matching_prefix_longest_first() {
        let t = tree(&["/", "/api", "/api/v1", "/apx", "/b"]);
        assert_eq!(hits(&t, "/api/v1/users"), vec![vec![2], vec![1], vec![0]]);
        assert_eq!(hits(&t, "/api/v2"), vec![vec![1], vec![0]]);
        assert_eq!(hits(&t, "/apx"), vec![vec![3], vec![0]]);
        assert_eq!(hits(&t, "/ap"), vec![vec![0]]);
        assert_eq!(hits(&t, "/b"), vec![vec![4], vec![0]]);
        assert_eq!(hits(&t, "x"), Vec::<Vec<u32>>::new());
    }

    #[test]
    fn split_keeps_existing_prefixes_and_shares_lists() {
        // Insert the long one first so that the short ones split its edge.
        let t = tree(&["/foobar", "/foo", "/fo", "/foo"]);
        assert_eq!(hits(&t, "/foobarbaz"), vec![vec![0], vec![1, 3], vec![2]]);
        assert_eq!(hits(&t, "/foob"), vec![vec![1, 3], vec![2]]);
        assert_eq!(hits(&t, "/f"), Vec::<Vec<u32>>::new());
    }

    #[test]
    fn empty_tree_matches_nothing() {
        let t = tree(&[]);
        assert_eq!(hits(&t, "/"), Vec::<Vec<u32>>::new());
    }
}
