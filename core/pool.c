/* kvshim pool: placeholder, being implemented. */
