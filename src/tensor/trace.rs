//! The trace context and the `Tensor` handle.
//!
//! A `Trace` owns the graph being built. A `Tensor` is a handle (trace, value id, type) into one.
//! Traces nest: the body of a `scan`, `checkpoint` or `value_and_grad` is traced in a child of
//! the trace that calls it. An operation binds into the innermost trace among its operands;
//! an operand from an enclosing trace is *captured* (becomes an extra input of the child, and
//! the parent value is passed in by the caller), so bodies may close over outer tensors freely.
//! Operations only on outer tensors land in the outer trace — loop-invariant code is hoisted
//! out of scan bodies for free.
//!
//! Errors: a shape or dtype mismatch panics with the op name, the operand types and the
//! caller's `file:line:col` (every public op is `#[track_caller]`). Model code reads like JAX,
//! without `?` on every op; `tensor::trace` catches the panic and returns it as a `TraceError`.
//! Nothing outlives a trace: there is no global state, a finished trace refuses new equations.

use crate::ir::{shape_rules, DType, Eqn, Graph, ManualAxis, Prim, Type, ValueId};
use crate::sharding::Mesh;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::rc::{Rc, Weak};

/// A handle to a graph under construction. Cloning shares the same trace.
#[derive(Clone)]
pub struct Trace(Rc<TraceCell>);

struct TraceCell {
    /// 0 for a root trace, parent's level + 1 for a body.
    level: usize,
    parent: Option<Trace>,
    /// The program's mesh, for checking sharding constraints where they are written.
    mesh: Option<Rc<Mesh>>,
    /// Inside a manual computation's body (and the bodies traced in it): the mesh axes it is
    /// manual over, which its collectives run across.
    manual_axes: Rc<[ManualAxis]>,
    closed: Cell<bool>,
    /// The body trace currently being built below this one, if any: new bodies nest in the
    /// deepest open trace, as JAX's dynamic trace stack does, found by walking these links.
    open_child: RefCell<Option<Weak<TraceCell>>>,
    state: RefCell<TraceState>,
}

#[derive(Default)]
struct TraceState {
    graph: Graph,
    /// Parent-trace tensors captured by this trace, and the local inputs standing for them.
    captures: Vec<Tensor>,
    capture_inputs: Vec<ValueId>,
    capture_index: HashMap<ValueId, ValueId>,
}

/// A traced value: which trace, which value, and its static type.
#[derive(Clone)]
pub struct Tensor {
    trace: Trace,
    id: ValueId,
    ty: Type,
}

impl Tensor {
    pub fn ty(&self) -> &Type {
        &self.ty
    }

    pub fn shape(&self) -> &[i64] {
        &self.ty.shape
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn rank(&self) -> usize {
        self.ty.rank()
    }

    /// The trace this tensor belongs to (to create constants next to it).
    pub fn trace(&self) -> &Trace {
        &self.trace
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {:?} at level {})", self.ty, self.id, self.trace.0.level)
    }
}

impl Trace {
    /// A fresh top-level trace.
    pub fn root(mesh: Option<Mesh>) -> Trace {
        Trace::new(0, None, mesh.map(Rc::new), Rc::from([]))
    }

    /// The top-level trace of a manual computation's body, manual over `axes`.
    pub(crate) fn manual_root(axes: &[ManualAxis]) -> Trace {
        Trace::new(0, None, None, Rc::from(axes))
    }

    /// A trace for a body called from this one.
    pub fn child(&self) -> Trace {
        let child = Trace::new(self.0.level + 1, Some(self.clone()), self.0.mesh.clone(), self.0.manual_axes.clone());
        *self.0.open_child.borrow_mut() = Some(Rc::downgrade(&child.0));
        child
    }

    fn new(level: usize, parent: Option<Trace>, mesh: Option<Rc<Mesh>>, manual_axes: Rc<[ManualAxis]>) -> Trace {
        let cell = TraceCell {
            level,
            parent,
            mesh,
            manual_axes,
            closed: Cell::new(false),
            open_child: RefCell::new(None),
            state: RefCell::default(),
        };
        Trace(Rc::new(cell))
    }

    /// The deepest trace still being built in this trace's tree: where a body traced now
    /// (`scan`, `checkpoint`, `value_and_grad`) belongs. E.g. `value_and_grad` over outer
    /// parameters inside a scan body nests in the scan body, so the loss may use its slices.
    pub fn current(&self) -> Trace {
        let mut t = self.clone();
        while let Some(p) = t.0.parent.clone() {
            t = p;
        }
        loop {
            let next = t.0.open_child.borrow().as_ref().and_then(Weak::upgrade);
            match next {
                Some(child) if !child.closed.get() => t = Trace(child),
                _ => return t,
            }
        }
    }

    pub fn mesh(&self) -> Option<&Mesh> {
        self.0.mesh.as_deref()
    }

    /// The manual axis `name` of the manual computation this trace is the body of (or is
    /// nested in), if it is one.
    pub fn manual_axis(&self, name: &str) -> Option<&ManualAxis> {
        self.0.manual_axes.iter().find(|a| a.name == name)
    }

    /// Adds a graph input of the given type.
    pub fn input(&self, ty: Type) -> Tensor {
        let mut st = self.0.state.borrow_mut();
        let id = st.graph.new_value(ty.clone());
        st.graph.inputs.push(id);
        Tensor { trace: self.clone(), id, ty }
    }

    /// Appends `prim(inputs)` to this trace after checking types, capturing operands that
    /// belong to enclosing traces. Panics with op, operand types and call site on a mismatch.
    #[track_caller]
    pub fn bind(&self, prim: Prim, inputs: &[&Tensor]) -> Vec<Tensor> {
        // Loops, not closures, keep `#[track_caller]` locations intact.
        let mut ids = Vec::with_capacity(inputs.len());
        for t in inputs {
            ids.push(self.lift(t));
        }
        let types: Vec<&Type> = inputs.iter().map(|t| &t.ty).collect();
        let out_types = match shape_rules::infer(&prim, &types) {
            Ok(t) => t,
            Err(msg) => op_error(prim.name(), &msg, &types),
        };
        let mut st = self.0.state.borrow_mut();
        let outs: Vec<Tensor> = out_types
            .into_iter()
            .map(|ty| Tensor { trace: self.clone(), id: st.graph.new_value(ty.clone()), ty })
            .collect();
        let outputs = outs.iter().map(|t| t.id).collect();
        st.graph.eqns.push(Eqn { prim, inputs: ids, outputs });
        outs
    }

    #[track_caller]
    pub fn bind1(&self, prim: Prim, inputs: &[&Tensor]) -> Tensor {
        let mut outs = self.bind(prim, inputs);
        debug_assert_eq!(outs.len(), 1);
        outs.pop().expect("single-result primitive")
    }

    /// The id standing for `t` in this trace, capturing it (through every level in between)
    /// if it belongs to an enclosing trace.
    #[track_caller]
    fn lift(&self, t: &Tensor) -> ValueId {
        if Rc::ptr_eq(&self.0, &t.trace.0) {
            if self.0.closed.get() {
                usage_error("a tensor is used after the trace that made it finished (did it escape a scan, checkpoint or grad body?)");
            }
            return t.id;
        }
        let parent = match &self.0.parent {
            Some(p) if t.trace.0.level < self.0.level => p,
            _ => usage_error(
                "a tensor from an unrelated trace is used here (did it escape a scan, checkpoint or grad body?)",
            ),
        };
        let in_parent = parent.lift(t);
        let mut st = self.0.state.borrow_mut();
        if let Some(&local) = st.capture_index.get(&in_parent) {
            return local;
        }
        let local = st.graph.new_value(t.ty.clone());
        st.captures.push(Tensor { trace: parent.clone(), id: in_parent, ty: t.ty.clone() });
        st.capture_inputs.push(local);
        st.capture_index.insert(in_parent, local);
        local
    }

    /// Closes the trace. Returns the graph — inputs in creation order, then one input per
    /// captured outer tensor — and the captured tensors (in the parent trace), which the
    /// caller must pass for those inputs.
    #[track_caller]
    pub fn finish(&self, outputs: &[&Tensor]) -> (Graph, Vec<Tensor>) {
        let mut out_ids = Vec::with_capacity(outputs.len());
        for t in outputs {
            out_ids.push(self.lift(t));
        }
        self.0.closed.set(true);
        if let Some(parent) = &self.0.parent {
            *parent.0.open_child.borrow_mut() = None;
        }
        let st = std::mem::take(&mut *self.0.state.borrow_mut());
        let mut graph = st.graph;
        graph.inputs.extend(st.capture_inputs);
        graph.outputs = out_ids;
        (graph, st.captures)
    }

    /// The innermost trace among the operands: where an operation on them belongs.
    #[track_caller]
    pub(crate) fn innermost<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Trace {
        let mut best: Option<&Trace> = None;
        for t in tensors {
            if best.is_none_or(|b| t.trace.0.level > b.0.level) {
                best = Some(&t.trace);
            }
        }
        match best {
            Some(t) => t.clone(),
            None => usage_error("an operation needs at least one tensor operand"),
        }
    }
}

/// Binds `prim` in the innermost trace of its operands and returns its single result.
#[track_caller]
pub(crate) fn apply1(prim: Prim, inputs: &[&Tensor]) -> Tensor {
    Trace::innermost(inputs.iter().copied()).bind1(prim, inputs)
}

/// Panics with the op name, what is wrong, the operand types and the call site.
#[track_caller]
pub(crate) fn op_error(op: &str, msg: &str, operands: &[&Type]) -> ! {
    op_error_at(op, msg, operands, Location::caller())
}

/// `op_error` with an explicit call site, for use inside closures (which cannot forward
/// `#[track_caller]`): capture `Location::caller()` in the enclosing function.
pub(crate) fn op_error_at(op: &str, msg: &str, operands: &[&Type], at: &Location) -> ! {
    let types: Vec<String> = operands.iter().map(|t| t.to_string()).collect();
    panic!("{op}: {msg}; operands: ({}); at {}:{}:{}", types.join(", "), at.file(), at.line(), at.column())
}

#[track_caller]
pub(crate) fn usage_error(msg: &str) -> ! {
    let at = Location::caller();
    panic!("{msg}; at {}:{}:{}", at.file(), at.line(), at.column())
}
