//! Request parameters as Prometheus reads them: the query string for GET, the query
//! string plus an `application/x-www-form-urlencoded` body for POST, keys repeatable.

use super::ApiError;
use axum::http::{header, HeaderMap, Method};
use strata_model::time::{parse_time, MAX_TIME, MIN_TIME};

pub struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    pub fn from_request(
        method: &Method,
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<Params, ApiError> {
        // The body's parameters come first: where both carry one, the body's wins, as Go's
        // `Request.FormValue` reads them.
        let mut pairs: Vec<(String, String)> = Vec::new();
        if method == Method::POST && !body.is_empty() {
            let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            if !ct.starts_with("application/x-www-form-urlencoded") {
                return Err(ApiError::bad_data(format!(
                    "unsupported Content-Type {ct:?}: send application/x-www-form-urlencoded"
                )));
            }
            pairs.extend(form_urlencoded::parse(body).into_owned());
        }
        pairs.extend(form_urlencoded::parse(query.unwrap_or("").as_bytes()).into_owned());
        Ok(Params { pairs })
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }

    pub fn all(&self, k: &str) -> Vec<&str> {
        self.pairs.iter().filter(|(a, _)| a == k).map(|(_, v)| v.as_str()).collect()
    }

    /// `start` and `end`, defaulting to the whole time range.
    pub fn range(&self) -> Result<(i64, i64), ApiError> {
        let start = match self.get("start") {
            Some(s) if !s.is_empty() => parse_time(s).map_err(|e| {
                ApiError::bad_data(format!("invalid parameter \"start\": Invalid time value for 'start': {e}"))
            })?,
            _ => MIN_TIME,
        };
        let end = match self.get("end") {
            Some(s) if !s.is_empty() => parse_time(s).map_err(|e| {
                ApiError::bad_data(format!("invalid parameter \"end\": Invalid time value for 'end': {e}"))
            })?,
            _ => MAX_TIME,
        };
        // An end before the start selects nothing (Prometheus answers an empty list).
        Ok((start, end))
    }
}
