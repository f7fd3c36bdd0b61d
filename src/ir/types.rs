//! Shapes and tensor types. A `Shape` is shared (`Arc<[i64]>`) because every traced value and
//! every `Tensor` handle carries one: cloning a handle must not allocate.

use super::DType;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// Static dimensions of a value, row-major. Rank 0 is a scalar.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shape(Arc<[i64]>);

impl Shape {
    pub fn new(dims: &[i64]) -> Shape {
        Shape(Arc::from(dims))
    }

    pub fn scalar() -> Shape {
        Shape::new(&[])
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn num_elements(&self) -> i64 {
        self.0.iter().product()
    }
}

impl Deref for Shape {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        &self.0
    }
}

impl From<&[i64]> for Shape {
    fn from(dims: &[i64]) -> Shape {
        Shape::new(dims)
    }
}

impl From<Vec<i64>> for Shape {
    fn from(dims: Vec<i64>) -> Shape {
        Shape(Arc::from(dims))
    }
}

impl<const N: usize> From<[i64; N]> for Shape {
    fn from(dims: [i64; N]) -> Shape {
        Shape::new(&dims)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// The static type of an IR value: element type and shape.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Type {
    pub dtype: DType,
    pub shape: Shape,
}

impl Type {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Type {
        Type { dtype, shape: shape.into() }
    }

    pub fn scalar(dtype: DType) -> Type {
        Type { dtype, shape: Shape::scalar() }
    }

    pub fn with_dtype(&self, dtype: DType) -> Type {
        Type { dtype, shape: self.shape.clone() }
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
}

/// `f32[4,8]`, as JAX prints avals.
impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Debug for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
